"""The explore generator: every scenario it writes validates against its stack file with the
project's own loader, with no warning that its window cannot be reached; the same seed gives the
same scenarios; it draws only what the stack offers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from chaos.explore.generate import MAKERS, _cuts_lmcache_off, fault_kinds_for, generate, stack_offer, write_scenario
from chaos.faults import registry
from chaos.scenario.loader import check_scenario, load_scenario

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "compose" / "reference.yml"


@pytest.fixture(scope="module")
def offer():
    return stack_offer(REFERENCE)


def test_200_scenarios_validate_with_no_unreachable_window(offer, tmp_path: Path) -> None:
    invalid, unreachable, kinds = [], [], Counter()
    for seed in range(100):
        for index in range(2):
            data = generate(offer, seed, index)
            path = write_scenario(data, tmp_path)
            check = check_scenario(path, require_commands=True)
            if not check.ok:
                invalid.append(f"{path.name}: {check.error()}")
                continue
            unreachable += [w for w in check.warning_lines() if "cannot be reached" in w or "inconclusive" in w]
            for _p, _i, fault in check.scenario.faults():
                kinds[fault.kind] += 1
                assert fault.trigger != "none"
    assert invalid == [], invalid[:3]
    assert unreachable == [], unreachable[:3]
    # every kind the reference stack offers is drawn in 200 scenarios
    assert set(kinds) == set(fault_kinds_for(offer)), kinds


def test_same_seed_same_scenarios_other_seed_others(offer) -> None:
    first = [generate(offer, 7, i) for i in range(10)]
    again = [generate(offer, 7, i) for i in range(10)]
    other = [generate(offer, 8, i) for i in range(10)]
    assert first == again
    assert first != other


def test_a_written_file_runs_alone_from_another_folder(offer, tmp_path: Path) -> None:
    path = write_scenario(generate(offer, 3, 0), tmp_path / "deep" / "er")
    s = load_scenario(path)
    assert Path(s.stack).resolve() == REFERENCE.resolve()


def test_workloads_cover_chunk_boundaries_tenants_turns_and_small_pools(offer) -> None:
    seen = Counter()
    for i in range(300):
        d = generate(offer, 1, i)
        w = d["workload"]
        chunk = offer.chunk
        if any(p % chunk in (0, 1, chunk - 1) for p in w["prefix_tokens"]):
            seen["boundary"] += 1
        seen["tenants"] += "tenants" in w
        seen["salt-list"] += isinstance(w.get("tenants"), list)
        seen["turns"] += w.get("turns", 1) > 1
        seen["small-pool"] += "ENGINE_NUM_BLOCKS" in d.get("variables", {})
        seen["overlap"] += any(len(p.get("faults", [])) > 1 for p in d["phases"])
        seen["sequence"] += sum(1 for p in d["phases"] if p.get("faults")) > 1
        seen["at_state"] += any(f.get("state") for p in d["phases"] for f in p.get("faults", []))
    assert all(seen[k] > 0 for k in ("boundary", "tenants", "salt-list", "turns", "small-pool", "overlap",
                                     "sequence", "at_state")), seen


def test_only_what_the_stack_offers(offer) -> None:
    """A stack without links, hooks or L2 gets no fault that needs them."""
    from dataclasses import replace

    bare = replace(offer, links=(), l2_tiers=(), redis=None,
                   capabilities=frozenset({"engine.metrics", "lmcache.http"}))
    kinds = fault_kinds_for(bare)
    assert "stall" not in kinds and "preempt" in kinds and "disk_full" not in kinds
    for i in range(50):
        d = generate(bare, 2, i)
        for p in d["phases"]:
            for f in p.get("faults", []):
                cls = registry.get(f["kind"])
                needs = cls.capability_needs(cls.params_model.model_validate(f))
                assert all(any(a in bare.capabilities for a in n.split("|")) for n in needs), f
                assert "link" not in f and f.get("service") != "redis"


def test_every_maker_is_a_registered_kind() -> None:
    assert set(MAKERS) <= set(registry.kinds())


def test_l2_faults_come_with_an_l1_flush_mostly(offer) -> None:
    """L2 (and the link to Redis) is used only for what L1 no longer holds: without an L1 flush
    in the phase, an l2_corrupt or a toxic on lmcache-redis mostly never acts (seen on seed 1:
    'did not act', the run inconclusive)."""
    assert offer.l2_links == ("lmcache-redis",)
    with_flush = without = 0
    for i in range(300):
        for phase in generate(offer, 4, i)["phases"]:
            faults = phase.get("faults", [])
            if any(f["kind"] == "l2_corrupt" or f.get("link") == "lmcache-redis" for f in faults):
                if any(f["kind"] == "tier_flush" and "l1" in f["tiers"] for f in faults):
                    with_flush += 1
                else:
                    without += 1
    assert with_flush > 2 * without, (with_flush, without)


def test_retrieve_stalls_come_with_a_slow_engine_link_mostly(offer) -> None:
    """A failed load whose retrieve LMCache never got (the adapter dropped it unsent while the
    engine->LMCache link was slow) is what reaches the engine's own lock free after a failed load
    (planted short-free-after-failed-load): LMCache releases the locks itself when it handles a
    retrieve late, as after retrieve_fail's pause (seen on seed 1, run 3: the bug planted, every
    check passed). So a stall before the retrieve mostly comes with a 3 s engine->LMCache link."""
    with_link = without = 0
    for seed in range(3):
        for i in range(300):
            for phase in generate(offer, seed, i)["phases"]:
                faults = phase.get("faults", [])
                if not any(f["kind"] == "stall" and f["point"] == "before_retrieve" for f in faults):
                    continue
                if any(f["kind"] == "latency" and f["link"] == "engine-lmcache" and f["latency_ms"] >= 3000
                       and f["stream"] == "downstream" for f in faults):
                    with_link += 1
                else:
                    without += 1
    assert with_link > 2 * without, (with_link, without)


def test_hit_recovery_after_lmcache_was_cut_off_and_nothing_emptied(offer, tmp_path: Path) -> None:
    """A client that never reconnects (F11) serves correct output: only hit_recovery sees it.
    The generator asks for it, after a settle phase, where a fault cut the engine off LMCache
    and none emptied or damaged what LMCache holds; not elsewhere."""
    with_check = 0
    for seed in range(60):
        for index in range(5):
            data = generate(offer, seed, index)
            faults = [f for ph in data["phases"] for f in ph.get("faults", [])]
            if "hit_recovery" not in data["checks"]:
                continue
            with_check += 1
            assert data["checks"]["hit_recovery"]["phases"] == ["recover"]
            # a settle with no request after the last phase that cut LMCache off (a window phase
            # of generate.window_focus may come between the drawn phases' settle and recover)
            assert data["phases"][-1]["name"] == "recover"
            last_cut = max(i for i, ph in enumerate(data["phases"])
                           if any(_cuts_lmcache_off(f, offer) for f in ph.get("faults", [])))
            assert any(ph["name"].startswith("settle") and ph["requests"] == 0
                       for ph in data["phases"][last_cut + 1:]), [ph["name"] for ph in data["phases"]]
            assert min(data["workload"]["prefix_tokens"]) >= offer.chunk
            assert not any(f["kind"] in ("l2_corrupt", "l2_fault_inject", "disk_full") for f in faults), faults
            assert any(f.get("service") == "lmcache" or f.get("link") == "engine-lmcache"
                       or f["kind"] in ("stall", "retrieve_fail") for f in faults), faults
            if with_check <= 3:
                check = check_scenario(write_scenario(data, tmp_path), require_commands=True)
                assert check.ok, check.error()
    assert with_check >= 10


def test_no_hit_recovery_where_lmcache_may_rightly_miss(offer) -> None:
    """Killed Redis, corrupted L2, every tier flushed, a sub-chunk prefix: no hit_recovery."""
    from chaos.explore.generate import _lmcache_cut_off_only
    kill = {"kind": "kill", "service": "lmcache", "signal": "SIGKILL", "duration": "3000ms"}
    workload = {"prefix_tokens": [offer.chunk, 2 * offer.chunk]}
    assert _lmcache_cut_off_only([{"faults": [kill]}], offer, workload)
    assert not _lmcache_cut_off_only([{"faults": [kill]}], offer, {"prefix_tokens": [offer.chunk - 1, offer.chunk]})
    flush_all = {"kind": "tier_flush", "tiers": ["fs", "l1", "redis"], "until": "end"}
    assert not _lmcache_cut_off_only([{"faults": [flush_all, kill]}], offer, workload)
    flush_l1 = {"kind": "tier_flush", "tiers": ["l1"], "until": "end"}
    assert _lmcache_cut_off_only([{"faults": [flush_l1, kill]}], offer, workload)
    for other in ({"kind": "kill", "service": "redis"}, {"kind": "l2_corrupt", "mode": "delete"}):
        assert not _lmcache_cut_off_only([{"faults": [kill]}, {"faults": [other]}], offer, workload)
    slow = {"kind": "latency", "link": "engine-lmcache", "latency_ms": 3000}
    assert _lmcache_cut_off_only([{"faults": [slow]}], offer, workload)
    assert not _lmcache_cut_off_only([{"faults": [{**slow, "latency_ms": 500}]}], offer, workload)
    assert not _lmcache_cut_off_only([{"faults": [{**slow, "link": "lmcache-redis"}]}], offer, workload)


# --- drawn to reach their windows (issue 33's tuning: seed 3306's 55-run exploration missed 22) ---

#: Scenarios of seed 3306 whose window was missed on the clean reference stack
#: (reports of `kvchaos explore --stack compose/reference.yml --jobs 2 --budget 55m --seed 3306`).
MISSED_3306 = {"pool": [7, 23, 44, 48, 50], "cancel": [16, 21, 26, 32, 49], "engine_flush": [13]}


def _used_prefixes(workload: dict) -> list[int]:
    lengths = workload["prefix_tokens"]
    return [lengths[i % len(lengths)] for i in range(workload["families"])]


def _pool_window(workload: dict) -> tuple[int, int]:
    """Blocks: two prompts fit at once from the first, two finished requests do not below the
    second (the reference engine: 16-token blocks, prompts allocated at admission)."""
    lengths = [p + workload["suffix_tokens"] for p in _used_prefixes(workload)]
    prompt = [-(-n // 16) for n in lengths]
    final = [-(-(n + workload["max_tokens"]) // 16) for n in lengths]
    return 2 * max(prompt), min(prompt) + min(final)


def _scenarios(offer, seeds=range(60), per_seed=10):
    for seed in seeds:
        for index in range(per_seed):
            yield seed, index, generate(offer, seed, index)


def test_small_pools_force_a_preemption_by_construction(offer) -> None:
    """Every drawn small pool admits two of the workload's prompts at once and cannot hold both
    once they have decoded: the `preempt via: pool` in it acts (seed 3306 runs 7, 23, 44, 48, 50
    never preempted: 1.3 times the longest request never held two 1 K-token prompts)."""
    pools = bad = 0
    for seed, index, d in [*(( 3306, i, generate(offer, 3306, i)) for i in MISSED_3306["pool"]), *_scenarios(offer)]:
        blocks = d.get("variables", {}).get("ENGINE_NUM_BLOCKS")
        if blocks is None:
            continue
        pools += 1
        low, below = _pool_window(d["workload"])
        if not low <= int(blocks) < below:
            bad += 1
        assert d["workload"]["concurrency"] >= 2 and d["workload"]["turns"] == 1
        assert not d.get("engine", {}).get("prefix_caching"), (seed, index)
        assert any(f["kind"] == "preempt" and f["via"] == "pool" for f in d["phases"][-1].get("faults", []))
    assert pools >= 60 and bad == 0, (pools, bad)


def test_small_pool_prefixes_stay_diverse(offer) -> None:
    """The pool's prefixes are redrawn near one length, yet that length still varies (chunk
    multiples, odd lengths, boundaries +-1)."""
    bases, offsets = set(), set()
    for _seed, _index, d in _scenarios(offer):
        if "ENGINE_NUM_BLOCKS" in d.get("variables", {}):
            p = d["workload"]["prefix_tokens"]
            bases.add(p[0])
            offsets.update(x - p[0] for x in p)
    assert len(bases) >= 5 and offsets == {-1, 0, 1}, (bases, offsets)


def _holds_lookups(f: dict) -> bool:
    return (f["kind"] in ("latency", "bandwidth", "slicer", "link_down", "reset_peer", "timeout")
            and f.get("link") == "engine-lmcache") or (f["kind"] == "pause" and f["service"] == "lmcache")


def test_cancels_are_drawn_to_reach_their_window(offer) -> None:
    """A cancel's window is open when its phase's requests start (it picks requests as they
    start: seed 3306 runs 26 and 49 opened it 2 s in, after them); one that picks by chance keeps
    it to the phase's end with at most a 10 % chance of picking none (run 21: p 0.5, 2 seen, none
    picked); an abort aimed at a lookup or a load has a fault of its phase holding LMCache's
    answers, or a stall before the retrieve (runs 16, 21, 32: on an idle link every abort
    arrived in prefill or decode)."""
    cancels = 0
    states = Counter()
    extra = [(3306, i, generate(offer, 3306, i)) for i in MISSED_3306["cancel"]]
    for seed, index, d in [*extra, *_scenarios(offer)]:
        requests = d["workload"]["requests"]
        for phase in d["phases"]:
            faults = phase.get("faults", [])
            for f in faults:
                if f["kind"] != "cancel":
                    continue
                cancels += 1
                where = (seed, index, f["name"])
                assert f["start"] == "0ms" and phase.get("requests_start") != "at_once", where
                assert phase.get("requests", requests) > 0, where
                if not f.get("storm") and f.get("probability", 1.0) < 1.0:
                    assert f.get("until") == "end" and (1 - f["probability"]) ** requests <= 0.1, where
                state = f.get("state")
                states[state] += 1
                others = [g for g in faults if g is not f]
                if state == "lookup":
                    assert any(_holds_lookups(g) for g in others), where
                if state == "load":
                    assert any((_holds_lookups(g) and g["kind"] not in ("link_down", "reset_peer", "timeout")
                                and g.get("latency_ms", 0) <= 1200) or g["kind"] == "pause"
                               or (g["kind"] == "stall" and g["point"] == "before_retrieve") for g in others), where
                    assert not any(g["kind"] in ("link_down", "reset_peer", "timeout", "retrieve_fail")
                                   and g.get("link") == "engine-lmcache" for g in others), where
    # still every mode and state
    assert cancels >= 60 and {"lookup", "load", "prefill", "decode", None} <= set(states), states


def test_every_workload_uses_a_full_chunk_prefix(offer) -> None:
    """Families take the prefix lengths in order: with fewer families than lengths, the one full
    chunk may go unused and nothing is stored (seed 5 scenario 0 on the earlier generator)."""
    for seed, index, d in [(5, 0, generate(offer, 5, 0)), *_scenarios(offer)]:
        assert max(_used_prefixes(d["workload"])) >= offer.chunk, (seed, index, d["workload"])


def test_no_engine_tier_flush_without_the_engine_prefix_cache(offer) -> None:
    """Every stack starts its engine without a prefix cache unless the scenario turns it on: an
    `engine` tier flush would flush nothing (seed 3306 run 13: inconclusive)."""
    flushes = 0
    for seed, index, d in [(3306, 13, generate(offer, 3306, 13)), *_scenarios(offer)]:
        for phase in d["phases"]:
            for f in phase.get("faults", []):
                if f["kind"] == "tier_flush" and "engine" in f["tiers"]:
                    flushes += 1
                    assert d.get("engine", {}).get("prefix_caching"), (seed, index)
    assert flushes > 0


def _loads(f: dict) -> bool:
    return (f["kind"] == "retrieve_fail" or (f["kind"] == "stall" and f["point"] == "before_retrieve")
            or (f["kind"] == "cancel" and f.get("state") == "load"))


def test_faults_on_a_retrieve_get_past_the_engine_prefix_cache(offer) -> None:
    """With the engine's prefix cache on, what the warm phase sent is held locally and never
    retrieved from LMCache: a phase with a fault that acts on a retrieve flushes the engine tier
    (seed 3306 runs 3, 21, 22 missed their stall, cancel at the load and retrieve_fail)."""
    seen = 0
    extra = [(3306, i, generate(offer, 3306, i)) for i in (3, 21, 22)]
    for seed, index, d in [*extra, *_scenarios(offer, seeds=range(120))]:
        if not d.get("engine", {}).get("prefix_caching"):
            continue
        for phase in d["phases"]:
            faults = phase.get("faults", [])
            if any(_loads(f) for f in faults):
                seen += 1
                assert any(f["kind"] == "tier_flush" and "engine" in f["tiers"] for f in faults), (seed, index)
    assert seen >= 3


def test_store_stalls_have_something_to_store(offer) -> None:
    """A stall before the store is reached only by a request with a full chunk its hit did not
    cover: a suffix that completes a chunk, or every tier flushed first (seed 3306 run 50)."""
    stalls = 0
    for seed, index, d in [(3306, 50, generate(offer, 3306, 50)), *_scenarios(offer, seeds=range(120))]:
        w = d["workload"]
        crosses = any(p % offer.chunk + w["suffix_tokens"] >= offer.chunk for p in _used_prefixes(w))
        flushed: set = set()
        for phase in d["phases"]:
            for f in phase.get("faults", []):
                if f["kind"] == "tier_flush":
                    flushed.update(f["tiers"])
            for f in phase.get("faults", []):
                if f["kind"] == "stall" and f["point"] == "before_store":
                    stalls += 1
                    assert crosses or flushed >= {"l1", *offer.l2_tiers}, (seed, index)
    assert stalls >= 3


def test_no_flush_of_the_tier_an_l2_corrupt_damages_in_its_phase(offer) -> None:
    """A flush in the l2_corrupt's phase is applied first and left nothing to damage (seed 60
    scenario 2: "no stored object matched when the fault ran")."""
    pairs = 0
    for seed, index, d in [(60, 2, generate(offer, 60, 2)), *_scenarios(offer, seeds=range(120))]:
        for phase in d["phases"]:
            faults = phase.get("faults", [])
            for c in [f for f in faults if f["kind"] == "l2_corrupt"]:
                damaged = {"fs", "redis"} if c["target"] == "both" else {c["target"]}
                for f in faults:
                    if f["kind"] == "tier_flush":
                        pairs += 1
                        assert not damaged & set(f["tiers"]), (seed, index, f["tiers"], c["target"])
    assert pairs >= 20


def test_a_cancel_beside_held_answers_aborts_inside_the_held_call(offer) -> None:
    """Beside a fault that holds LMCache's answers a cancel with no state counts only aborts
    that landed in the lookup or load: after the first token never does (seed 60 scenario 0,
    once a slowed link was added there for an at_state lookup cancel)."""
    beside = 0
    for seed, index, d in [(60, 0, generate(offer, 60, 0)), *_scenarios(offer, seeds=range(120))]:
        for phase in d["phases"]:
            faults = phase.get("faults", [])
            for f in faults:
                if f["kind"] != "cancel" or f["mode"] == "at_state":
                    continue
                holders = [g for g in faults if g is not f and registry.get(g["kind"]).holds_lmcache_answers(
                    registry.get(g["kind"]).params_model.model_validate(g))]
                if holders:
                    beside += 1
                    assert f["mode"] == "after_ms" and 200 <= f["after_ms"] <= 400, (seed, index, f)
    assert beside >= 5
