"""The windows the generator makes sure of (issue 33, acceptance 1): four planted bugs of the
reference engine were not found in 6-7 runs of seed 1 because the main draws met their windows
too rarely (a local prefix-cache hit: 16 % of scenarios 0-199 of seeds 1-3; a retrieve dropped
unsent: 3.7 %, first at index 11, 25, 30; an abort after allocation: 12 %, first at 29 for seed
1; tenants: 27 %). Statistics of generated scenarios only (benchmarks/explore_features.py's
classifier): nothing runs."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from chaos.duration import parse_duration
from chaos.explore.generate import (
    WINDOW_BLOCK, WINDOW_FOCI, generate, stack_offer, window_focus, write_scenario,
)
from chaos.scenario.loader import check_scenario

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import explore_features as ef  # noqa: E402

REFERENCE = REPO / "compose" / "reference.yml"

#: focus -> the benchmarks/explore_features.py feature it must give the scenario
FEATURE_OF = {"local-hit": "local-hit", "dropped-retrieve": "dropped-retrieve",
              "abort-in-load": "abort-with-blocks", "tenants": "tenants"}


@pytest.fixture(scope="module")
def offer():
    return stack_offer(REFERENCE)


def test_each_block_of_a_seed_deals_each_window_once_the_same_way_every_time(offer) -> None:
    for seed in (0, 1, 55, 3306):
        for block in range(3):
            foci = [window_focus(offer, seed, block * WINDOW_BLOCK + i) for i in range(WINDOW_BLOCK)]
            assert sorted(f for f in foci if f) == sorted(WINDOW_FOCI), (seed, block, foci)
            assert foci == [window_focus(offer, seed, block * WINDOW_BLOCK + i) for i in range(WINDOW_BLOCK)]
    decks = {tuple(window_focus(offer, s, i) for i in range(WINDOW_BLOCK)) for s in range(20)}
    assert len(decks) > 5  # shuffled per seed, not one fixed order


def test_every_focused_scenario_has_its_window_feature(offer) -> None:
    for seed in range(40):
        for index in range(WINDOW_BLOCK):
            focus = window_focus(offer, seed, index)
            if focus is None:
                continue
            d = generate(offer, seed, index)
            if focus == "local-hit" and "ENGINE_NUM_BLOCKS" in d.get("variables", {}):
                # the drawn small pool wins (sized with the prefix cache off): no local-hit phase
                assert not d.get("engine", {}).get("prefix_caching"), (seed, index)
                assert "local-hit" not in [p["name"] for p in d["phases"]], (seed, index)
                continue
            _bug, test = ef.FEATURES[FEATURE_OF[focus]]
            assert test(d, offer), (seed, index, focus, d["phases"])


def test_each_window_is_met_in_the_first_block_of_nearly_every_seed(offer) -> None:
    """Seeds 0-59, indexes 0-5: each window in every seed, but local-hit, which yields to a drawn
    small pool (sized with the prefix cache off). Before: dropped-retrieve in 3 of seeds 1-3'
    first 6 scenarios 0 times."""
    met = Counter()
    for seed in range(60):
        scenarios = [generate(offer, seed, i) for i in range(WINDOW_BLOCK)]
        for feature in FEATURE_OF.values():
            met[feature] += any(ef.FEATURES[feature][1](d, offer) for d in scenarios)
    assert met["dropped-retrieve"] == met["abort-with-blocks"] == met["tenants"] == 60, met
    assert met["local-hit"] >= 54, met


def test_the_features_of_the_bugs_found_before_do_not_collapse(offer) -> None:
    """Scenarios 0-199 of seeds 1-3, fractions measured on main before this change in brackets
    (benchmarks/explore_features.py): the four windows rise, the rest keep at least 80 % of
    what they had."""
    out = ef.measure(offer, [1, 2, 3], 200)["fraction"]
    before = {"hit-phase": 0.330, "hit-recovery": 0.162, "retrieve-fail": 0.108, "cut-off": 0.390,
              "preemption": 0.212, "cancel": 0.188, "store-after-hit": 0.167}
    for feature, was in before.items():
        assert out[feature] >= 0.8 * was, (feature, out[feature], was)
    rose = {"local-hit": 0.160, "dropped-retrieve": 0.037, "abort-with-blocks": 0.123, "tenants": 0.265}
    for feature, was in rose.items():
        assert out[feature] >= was + 0.1, (feature, out[feature], was)


def test_focused_scenarios_validate_with_no_unreachable_window(offer, tmp_path: Path) -> None:
    invalid, unreachable, seen = [], [], Counter()
    for seed in range(12):
        for index in range(WINDOW_BLOCK):
            focus = window_focus(offer, seed, index)
            if focus is None:
                continue
            seen[focus] += 1
            path = write_scenario(generate(offer, seed, index), tmp_path)
            check = check_scenario(path, require_commands=True)
            if not check.ok:
                invalid.append(f"{path.name}: {check.error()}")
                continue
            unreachable += [w for w in check.warning_lines() if "cannot be reached" in w or "inconclusive" in w]
    assert invalid == [], invalid[:3]
    assert unreachable == [], unreachable[:3]
    assert set(seen) == set(WINDOW_FOCI), seen


def test_the_dropped_retrieve_phase_is_the_catalogues_and_lets_the_link_settle(offer) -> None:
    """As scenarios/retrieve-dropped-slow-link.yaml, held longer (10 s: the 6 s stall ended before
    the adapter counted LMCache unhealthy on a loaded host, seed 1 scenario 4): 3 s answers from
    1.5 s for 14 s; then 5 s with no request; past the engine's prefix cache; the liveness
    deadline counts the latency's 14 s (twice, as every drawn fault's duration)."""
    n = 0
    for seed in range(30):
        for index in range(WINDOW_BLOCK):
            if window_focus(offer, seed, index) != "dropped-retrieve":
                continue
            d = generate(offer, seed, index)
            names = [p["name"] for p in d["phases"]]
            at = names.index("dropped-retrieve")
            assert names[at + 1] == "settle-link" and d["phases"][at + 1]["requests"] == 0
            faults = d["phases"][at]["faults"]
            kinds = {f["kind"]: f for f in faults}
            assert kinds["stall"]["seconds"] == "10000ms" and kinds["stall"]["point"] == "before_retrieve"
            assert kinds["latency"]["latency_ms"] == 3000 and kinds["latency"]["start"] == "1500ms"
            assert kinds["latency"]["duration"] == "14000ms"  # past the held retrieve
            assert d["checks"]["liveness"]["request_deadline_s"] >= 60 + 28
            if d.get("engine", {}).get("prefix_caching"):
                assert any(f["kind"] == "tier_flush" and "engine" in f["tiers"] for f in faults)
            n += 1
    assert n == 30


def _phase_fault_seconds(phase: dict) -> float:
    return sum(parse_duration(f.get("duration", "0ms")) for f in phase.get("faults", []))


def test_the_liveness_deadline_covers_every_phase_in_any_unit_and_the_held_retrieve_is_the_windows(offer) -> None:
    """The deadline is 60 s + 2 x the longest phase's summed fault durations. The pairing of a
    drawn stall before the retrieve with a slow link (``_slow_link_under_held_retrieve``) wrote
    its latency's duration as "12s", which the generator's own reader took for 0 s (it read only
    "ms"): seed 1 scenario 11's deadline was 60 s for a 12 s fault phase (6 more in seeds 1-3).
    The pairing now holds the retrieve as long as the dropped-retrieve window does (10 s: 6 s
    lost the race with the adapter's health check at load average 25)."""
    short, held, paired = [], [], 0
    for seed in (1, 2, 3):
        for index in range(60):
            d = generate(offer, seed, index)
            longest = max(_phase_fault_seconds(p) for p in d["phases"])
            if d["checks"]["liveness"]["request_deadline_s"] < 60 + 2 * longest:
                short.append((seed, index, longest, d["checks"]["liveness"]["request_deadline_s"]))
            for phase in d["phases"]:
                if phase["name"] == "dropped-retrieve":
                    continue
                faults = phase.get("faults", [])
                stalls = [f for f in faults if f["kind"] == "stall" and f["point"] == "before_retrieve"]
                slow = [f for f in faults if f["kind"] == "latency" and f.get("start") == "1500ms"]
                if stalls and slow:
                    paired += 1
                    if (stalls[0]["seconds"], slow[0]["duration"]) != ("10000ms", "14000ms"):
                        held.append((seed, index, stalls[0]["seconds"], slow[0]["duration"]))
    assert short == [], short
    assert held == [], held
    assert paired >= 1
