"""chaos/shrink's search on a predicate instead of a stack: it finds a local minimum, keeps the
target check only, is deterministic, verifies the result, and writes YAML that loads back as a
scenario. (A real shrink on the reference stack: tests/shrink/test_shrink_stack.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.scenario.loader import load_scenario
from chaos.scenario.model import Scenario
from chaos.shrink.cli import scenario_yaml
from chaos.shrink.shrink import _valid, normalise, reductions, shrink, size

REPO = Path(__file__).resolve().parents[2]


def _scenario(name: str = "retrieve-fail-after-lookup") -> Scenario:
    return load_scenario(REPO / "scenarios" / f"{name}.yaml")


def _fails_when(pred):
    calls = []

    def fails(s: Scenario):
        calls.append(size(s))
        return pred(s), 0.01, "predicate"
    return fails, calls


def _needs_the_failed_retrieve_and_two_requests(s: Scenario) -> bool:
    kinds = {f.kind for p in s.phases for f in p.faults}
    return "retrieve_fail" in kinds and sum(s.phase_requests(p) for p in s.phases) >= 2


def test_shrink_reaches_a_local_minimum_and_keeps_only_the_check() -> None:
    fails, _ = _fails_when(_needs_the_failed_retrieve_and_two_requests)
    res = shrink(_scenario(), "recompute_equivalence", fails, reruns=3)
    s = res.scenario
    assert res.verified == 3 and s.checks.enabled() == ["recompute_equivalence"]
    assert [f.kind for p in s.phases for f in p.faults] == ["retrieve_fail"]
    assert size(s)["requests"] == 2 and len(s.phases) == 1
    assert s.workload.concurrency == 1 and s.workload.max_tokens == 1
    assert res.original["requests"] == 6 and res.final == size(s)
    # no single reduction of the result still fails: it is 1-minimal for the predicate
    assert not any(_needs_the_failed_retrieve_and_two_requests(c) for _, c in reductions(s)
                   if any(c.phase_requests(p) for p in c.phases))


def test_two_shrinks_give_the_same_file(tmp_path: Path) -> None:
    texts = []
    for _ in range(2):
        fails, _ = _fails_when(_needs_the_failed_retrieve_and_two_requests)
        res = shrink(_scenario(), "recompute_equivalence", fails)
        texts.append(scenario_yaml(res.scenario, tmp_path / "x.yaml", "header"))
    assert texts[0] == texts[1]


def test_written_yaml_loads_back_as_the_same_scenario(tmp_path: Path) -> None:
    fails, _ = _fails_when(_needs_the_failed_retrieve_and_two_requests)
    res = shrink(_scenario(), "recompute_equivalence", fails)
    out = tmp_path / "sub" / "shrunk.yaml"
    out.parent.mkdir()
    out.write_text(scenario_yaml(res.scenario, out, "a header\nsecond line"))
    back = load_scenario(out)
    assert back.model_dump(exclude={"stack"}) == res.scenario.model_dump(exclude={"stack"})
    assert Path(back.stack).resolve() == Path(res.scenario.stack).resolve()
    assert out.read_text().startswith("# yaml-language-server") and "# second line" in out.read_text()


def test_a_run_that_does_not_fail_again_is_an_error() -> None:
    fails, calls = _fails_when(lambda s: False)
    with pytest.raises(ValueError, match="does not fail"):
        shrink(_scenario("smoke"), "recompute_equivalence", fails, reruns=3)
    assert len(calls) == 3  # a timing-dependent failure gets three tries to show again


def test_flaky_candidates_fall_back_to_one_that_fails_every_rerun() -> None:
    """Candidates with fewer than 4 requests fail once in the search, then pass: the final
    verification keeps the smallest one that fails all reruns."""
    seen: dict[int, int] = {}

    def fails(s: Scenario):
        n = size(s)["requests"]
        seen[n] = seen.get(n, 0) + 1
        return (n >= 4 or seen[n] == 1), 0.01, ""

    res = shrink(_scenario("smoke"), "recompute_equivalence", fails, reruns=3)
    assert res.verified == 3 and res.final["requests"] >= 4


def test_budget_stops_the_search_but_still_verifies() -> None:
    fails, _ = _fails_when(lambda s: True)
    res = shrink(_scenario("smoke"), "recompute_equivalence", fails, budget_s=0.0)
    assert res.budget_spent and res.verified == 3 and res.final == res.original


def test_a_slow_first_run_extends_the_budget_to_so_many_runs() -> None:
    """The input that showed it: the zoo's shrink of lookup-timeout with no-reconnect got 10 x
    its caught run (10 s) while each of its candidates took 25-60 s on the shrink's stack
    (engine restarts between bugs on and off): its budget ended after 5 candidates, at 40
    requests and 3 phases. ``runs_at_least`` counts in the shrink's own first run."""
    def slow(s: Scenario):
        return True, 10.0, "predicate"  # says each run took 10 s (it takes none)

    res = shrink(_scenario("smoke"), "recompute_equivalence", slow, budget_s=0.0, runs_at_least=30)
    assert not res.budget_spent and res.final["requests"] < res.original["requests"]
    res = shrink(_scenario("smoke"), "recompute_equivalence", slow, budget_s=0.0)
    assert res.budget_spent and res.final == res.original


def test_normalise_makes_requests_explicit() -> None:
    s = normalise(_scenario("smoke"), "recompute_equivalence")
    assert [p.requests for p in s.phases] == [12, 12] and s.name == "smoke-shrunk"


def _store_then_hit(s: Scenario) -> bool:
    """A false hit needs a phase that stores and a later one that hits (chunk-boundary-full-hit
    with hit-plus-one-chunk)."""
    reqs = [s.phase_requests(p) for p in s.phases]
    return any(n and any(reqs[i + 1:]) for i, n in enumerate(reqs))


def _kill_then_a_request_in_recover(s: Scenario) -> bool:
    """No recovery after a node exit (lmcache-restart, node-exit-lmcache with no-reconnect):
    the kill and at least one request in the recover phase after it."""
    for i, p in enumerate(s.phases):
        if any(f.kind == "kill" for f in p.faults):
            return any(q.name == "recover" and s.phase_requests(q) for q in s.phases[i + 1:])
    return False


@pytest.mark.parametrize("name,check,pred", [
    ("chunk-boundary-full-hit", "recompute_equivalence", _store_then_hit),
    ("lmcache-restart", "hit_recovery", _kill_then_a_request_in_recover),
    ("node-exit-lmcache", "hit_recovery", _kill_then_a_request_in_recover),
])
def test_the_size_bound_is_reached_in_few_runs(name, check, pred) -> None:
    """On a stack each candidate is a whole run (up to a minute with a restart and a reconnect
    wait): the bound of `kvchaos zoo --shrink` (<= 2 phases, <= 8 requests) must come within
    the first 10 runs, not after the search has re-tried the same failed changes after every
    step (it took 15 and more when each accepted step restarted every pass)."""
    fails, calls = _fails_when(pred)
    res = shrink(_scenario(name), check, fails, reruns=3)
    first = next(i for i, c in enumerate(calls) if c["phases"] <= 2 and c["requests"] <= 8 and
                 res.steps[i].accepted)
    assert first < 10, [(s.change, s.accepted) for s in res.steps]
    assert res.verified == 3 and res.final["phases"] <= 2 and res.final["requests"] <= 2


def _nothing_stored_before_recover(s: Scenario) -> bool:
    """hit_recovery fails on any engine when no phase before `recover` sent a request: there
    is nothing to hit."""
    names = [p.name for p in s.phases]
    if "recover" not in names:
        return False
    i = names.index("recover")
    return s.phase_requests(s.phases[i]) > 0 and not any(s.phase_requests(p) for p in s.phases[:i])


def test_a_control_keeps_the_search_from_slipping_to_a_failure_of_its_own() -> None:
    """The input that showed it: `kvchaos shrink` of lmcache-restart caught with no-reconnect
    ended at one `recover` request and no fault, which fails hit_recovery on the clean engine
    too (nothing was stored before it): the search had slipped when it took the crash phase's
    requests to 0. With the clean engine as control such a step is refused."""
    def with_bug(s: Scenario) -> bool:
        return _kill_then_a_request_in_recover(s) or _nothing_stored_before_recover(s)

    fails, _ = _fails_when(with_bug)
    slipped = shrink(_scenario("lmcache-restart"), "hit_recovery", fails, reruns=3)
    assert _nothing_stored_before_recover(slipped.scenario)  # what happened without a control

    fails, calls = _fails_when(with_bug)
    control, _ = _fails_when(_nothing_stored_before_recover)
    res = shrink(_scenario("lmcache-restart"), "hit_recovery", fails, reruns=3, control=control)
    s = res.scenario
    assert res.verified == 3 and not _nothing_stored_before_recover(s) and _kill_then_a_request_in_recover(s)
    assert res.final["phases"] <= 2 and res.final["requests"] <= 8
    assert any("fails without the bug too" in st.note for st in res.steps)


def _stored_before(s: Scenario, k: int) -> bool:
    """A request stored to LMCache before the kill of phase ``k``: one of an earlier phase, or
    of phase k itself when the kill comes after its requests (with ``after: phase_start`` its
    requests meet the dead server)."""
    kill = next(f for f in s.phases[k].faults if f.kind == "kill")
    return (any(s.phase_requests(p) for p in s.phases[:k])
            or (kill.after == "requests" and s.phase_requests(s.phases[k]) > 0))


def _kill_index(s: Scenario) -> int | None:
    return next((i for i, p in enumerate(s.phases) if any(f.kind == "kill" for f in p.faults)), None)


def _no_reconnect_on_the_stack(s: Scenario) -> bool:
    """What the reference stack does with no-reconnect (zoo run of lmcache-restart): the
    recover phase misses when something was stored before the kill and a recover request comes
    after it (the engine gave LMCache up); or when nothing was stored at all."""
    k = _kill_index(s)
    names = [p.name for p in s.phases]
    if "recover" not in names or not s.phase_requests(s.phases[names.index("recover")]):
        return False
    if k is None or k >= names.index("recover"):
        return _nothing_stored_before_recover(s)
    return True


def _clean_stack_fails(s: Scenario) -> bool:
    """The clean engine reconnects: recover fails only when nothing was stored before it
    (requests that met the dead server stored nothing)."""
    names = [p.name for p in s.phases]
    if "recover" not in names:
        return False
    r = names.index("recover")
    k = _kill_index(s)
    stored = any(s.phase_requests(p) for i, p in enumerate(s.phases[:r]) if i != k)
    if k is not None and k < r:
        stored = stored or _stored_before(s, k)
    return s.phase_requests(s.phases[r]) > 0 and not stored


def test_a_phase_that_only_holds_a_fault_is_merged_into_the_one_before() -> None:
    """The input that showed it: the zoo's shrink of lmcache-restart with no-reconnect (a
    control run for every accepted step) stopped at warm / crash / recover, 21 requests: the
    crash phase's kill must come after something was stored and before the recover requests,
    so no phase could be dropped. Every phase at 1 request, then the crash phase's faults moved
    into warm after its requests (``after: requests``), reach 2 phases and 2 requests."""
    fails, calls = _fails_when(_no_reconnect_on_the_stack)
    control, _ = _fails_when(_clean_stack_fails)
    res = shrink(_scenario("lmcache-restart"), "hit_recovery", fails, reruns=3, control=control)
    s = res.scenario
    assert res.verified == 3 and (res.final["phases"], res.final["requests"]) == (2, 2), \
        [(st.change, st.accepted) for st in res.steps]
    (kill,) = [f for p in s.phases for f in p.faults]
    assert kill.after == "requests" and s.phases[0].faults == [kill]
    assert not _clean_stack_fails(s)
    assert len(calls) < 30, len(calls)


def test_merge_gives_an_until_end_fault_the_window_it_had() -> None:
    s = normalise(_scenario("lookup-timeout"), "hit_recovery")
    merged = [c for change, c in reductions(s, {"stall-engine-lmcache": 7.25}) if change.startswith("merge phase stall")]
    (c,) = merged
    assert [p.name for p in c.phases] == ["warm", "settle", "recover"]
    (f,) = c.phases[0].faults
    assert (f.after, f.until, f.duration, f.start) == ("requests", None, 7.25, 0.0)
    assert "after: requests" in scenario_yaml(c, REPO / "scenarios" / "x.yaml")


def test_merge_keeps_a_fault_that_held_requests_valid() -> None:
    """The input: node-exit-lmcache's kill holds the outage requests (`hold_requests`); merged
    into warm it comes after warm's requests (`after: requests`), a pair the model refuses, so
    the merge candidate was invalid and silently skipped (found in review)."""
    s = normalise(_scenario("node-exit-lmcache"), "hit_recovery")
    assert [f.hold_requests for p in s.phases for f in p.faults] == [True]
    (c,) = [c for change, c in reductions(s, {}) if change.startswith("merge phase outage")]
    (f,) = c.phases[0].faults
    assert (f.after, f.hold_requests) == ("requests", False)
    assert _valid(c)
