"""explore's bookkeeping without a stack: outcomes, missed triggers, a failure seen twice is one
signature counted twice (the second not shrunk), the finding's file validates, summary.json and
index.html say so. The results are real RunResult models built by the report layer."""

from __future__ import annotations

import json
from pathlib import Path

from chaos.checks.result import CheckResult
from chaos.explore.explore import ExploreOptions, ExploreSummary, _finding, _record, classify, missed_triggers
from chaos.explore.generate import generate, stack_offer, write_scenario
from chaos.report.result import build_result
from chaos.scenario.loader import check_scenario

REPO = Path(__file__).resolve().parents[2]

EVIDENCE_MISSED = CheckResult(name="evidence", verdict="unknown", summary="inconclusive", details={
    "faults": [{"kind": "latency", "acted": True, "default_trigger": {"default": "latency"}, "problem": "not reached"},
               {"kind": "kill", "acted": False, "default_trigger": None, "problem": "did not bite"}],
    "phases": [{"phase": "hit", "trigger": {"conditions": [{"metric": "vllm:external_prefix_cache_hits_total"}]},
                "problem": "trigger not reached"}]})


def _result(run_id: str, checks: list[CheckResult], path: Path, bugs=()):
    return build_result(run_id=run_id, scenario="explore-5-0", history=[], checks=checks, scenario_path=str(path),
                        engine_bugs=list(bugs))


def test_outcomes_and_missed_triggers(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    inconclusive = _result("r1", [CheckResult(name="liveness", verdict="passed", summary=""), EVIDENCE_MISSED], path)
    assert classify(inconclusive) == "inconclusive"
    assert missed_triggers(inconclusive) == ["latency: default trigger", "kill: did not act",
                                             "phase hit: vllm:external_prefix_cache_hits_total"]
    failed = _result("r2", [CheckResult(name="leaks", verdict="failed", summary="held")], path)
    assert classify(failed) == "failed"
    assert classify(_result("r3", [], path)) == "passed"


def test_an_inconclusive_run_that_reached_its_window_is_counted_by_its_undecided_check(tmp_path: Path) -> None:
    """Input that showed it: `kvchaos explore --stack compose/vllm-cpu.yml --seed 4101` run 2
    (2026-12-07): evidence passed (the reset acted, both triggers reached) and every other check
    passed but hit_quality, undecided ("hit: too few samples (1 completed without
    cached_token_stats; at least 4 needed)"); the run was counted under "(no trigger row: see the
    run's evidence check)", which names no cause and sends the reader to a check that passed."""
    summary = ExploreSummary(explore_id="explore-4101-x", folder=tmp_path / "out", stack="s.yml", seed=4101,
                             bugs=[], budget_s=60, max_runs=1, started_at="now")
    result = _result("r2", [CheckResult(name="evidence", verdict="passed", summary="faults acted: 1 of 1",
                                        details={"faults": [{"kind": "reset_peer", "acted": True, "problem": None}],
                                                 "phases": [{"phase": "hit", "problem": None}]}),
                            CheckResult(name="hit_quality", verdict="unknown",
                                        summary="hit: too few samples (1 completed without cached_token_stats; "
                                                "at least 4 needed)")], tmp_path / "s.yaml")
    assert classify(result) == "inconclusive"
    _record(summary, 2, tmp_path / "s.yaml", tmp_path / "r2", result, 1.0, 1.0)
    assert summary.runs[-1]["missed_triggers"] == ["check hit_quality: undecided"]
    assert summary.runs[-1]["window_reached"] is True
    assert summary.as_dict()["inconclusive_by_trigger"] == {"check hit_quality: undecided": 1}


def _planted(tmp_path: Path, seed: int, index: int, bug: str, *, max_runs: int, known=()) -> tuple:
    """Scenario ``index`` of ``seed`` on compose/reference.yml with ``bug`` planted, written under
    ``tmp_path/scenarios``: (the scenario, its path, an empty summary, the options)."""
    offer = stack_offer(REPO / "compose" / "reference.yml")
    data = generate(offer, seed, index)
    data["engine"] = {"bugs": [bug]}
    path = write_scenario(data, tmp_path / "scenarios")
    summary = ExploreSummary(explore_id=f"explore-{seed}-x", folder=tmp_path / "out", stack=str(offer.path),
                             seed=seed, bugs=[bug], budget_s=60, max_runs=max_runs, started_at="now")
    return check_scenario(path).scenario, path, summary, ExploreOptions(seed=seed, shrink_budget_s=0,
                                                                        known=list(known))


def test_a_failure_seen_twice_is_one_signature_counted_twice(tmp_path: Path) -> None:
    scenario, path, summary, opts = _planted(tmp_path, 5, 0, "hit-plus-one-chunk", max_runs=2)
    failing = [CheckResult(name="recompute_equivalence", verdict="failed", summary="token 1 differs")]
    pre_seen: dict = {}
    for i in range(2):
        run_dir = tmp_path / "runs" / f"r{i}"
        run_dir.mkdir(parents=True)
        # the result names no engine bug: no control run on the clean engine (that needs a stack)
        result = _result(f"r{i}", failing, path)
        _record(summary, i, path, run_dir, result, 1.0, 10.0 * (i + 1))
        _finding(summary, opts, i, run_dir, result, scenario, pre_seen, tmp_path / "out" / "findings", None, 0.0,
                 lambda: 60.0, lambda _m: None)
    (sig,) = summary.signatures.values()
    assert sig["count"] == 2 and sig["first_run_index"] == 0 and sig["first_elapsed_s"] == 10.0
    assert sig["known"] is None and not sig["shrink"]["done"]
    kinds = sorted({f.kind for _p, _i, f in scenario.faults()})
    assert sig["faults"] == kinds and sig["checks"] == ["recompute_equivalence"]
    check = check_scenario(sig["scenario"], require_commands=True)  # the copied file, its stack relinked
    assert check.ok, check.error()
    assert check.scenario.engine.bugs == ["hit-plus-one-chunk"]
    summary.write()
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert written["failed"] == 2 and written["run_count"] == 2 and len(written["signatures"]) == 1
    assert [r["signature"] for r in written["runs"]] == [sig["signature"]] * 2
    page = (tmp_path / "out" / "index.html").read_text()
    assert sig["signature"] in page and "run 0, after 10.0 s" in page


def test_one_planted_bug_two_runs_one_signature(tmp_path: Path) -> None:
    """Input that showed it: `make explore-smoke` (hit-plus-one-chunk, seed 55) gave two
    signatures for its one bug: run 0 failed recompute_equivalence (shrunk to no fault), run 1
    failed recompute_equivalence, isolation and hit_quality with reset_peer + slicer (not shrunk:
    the budget was spent); the control on the clean engine passed run 0's check and run 1's
    checks (it failed only leaks). One bug, one signature: the finding's check is the run's first
    failed one (the shrink's target) and the control shows the faults are not needed."""
    from chaos.explore.explore import _sign

    offer = stack_offer(REPO / "compose" / "reference.yml")
    summary = ExploreSummary(explore_id="explore-55-x", folder=tmp_path / "out", stack=str(offer.path), seed=55,
                             bugs=["hit-plus-one-chunk"], budget_s=60, max_runs=2, started_at="now")
    opts = ExploreOptions(seed=55, shrink_budget_s=0)
    pre_seen: dict = {}
    (tmp_path / "out" / "findings").mkdir(parents=True)
    runs = [["recompute_equivalence"], ["recompute_equivalence", "isolation", "hit_quality"]]
    for i, failed in enumerate(runs):
        data = generate(offer, 55, i)
        data["engine"] = {"bugs": ["hit-plus-one-chunk"]}
        path = write_scenario(data, tmp_path / "scenarios")
        scenario = check_scenario(path).scenario
        run_dir = tmp_path / "runs" / f"r{i}"
        run_dir.mkdir(parents=True)
        checks = [CheckResult(name=n, verdict="failed", summary="x") for n in failed]
        result = _result(f"r{i}", checks, path, bugs=["hit-plus-one-chunk"])
        _record(summary, i, path, run_dir, result, 1.0, 10.0 * (i + 1))
        probe = {"clean_engine": "failed" if i else "passed", "clean_engine_failed_checks": ["leaks"] if i else [],
                 "attributed_to_bug": True, "faults_irrelevant": "control"}
        _sign(summary, opts, i, run_dir, result, summary.runs[-1], "prefix_length", scenario, {"done": False},
              tmp_path / "pending.yaml", (tuple(failed), "prefix_length", ()), pre_seen, tmp_path / "out" / "findings",
              0.0, lambda _m: None, probe)
    (sig,) = summary.signatures.values()
    assert sig["signature"] == "checks=recompute_equivalence | diagnosis=prefix_length | faults=-"
    assert sig["count"] == 2 and sig["failed_checks"] == ["recompute_equivalence"]
    assert sig["faults_irrelevant"] == "control" and sig["attributed_to_bug"] is True


def _sign_leak(tmp_path: Path, summary, opts, scenario, path: Path, i: int, started: str, log_name: str,
               lines: list[str], scenario_name: str, leak: str) -> dict:
    """Run ``i`` of an exploration recorded and signed: its ``logs/<log_name>`` holds ``lines``,
    it started at ``started`` and failed ``leaks`` with ``leak``; the signature entry ``_sign``
    gives (the summary's signatures cleared first, so each run is signed afresh)."""
    from chaos.explore.explore import _sign

    run_dir = tmp_path / "runs" / f"r{i}"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / log_name).write_text("\n".join(lines) + "\n")
    result = build_result(run_id=f"r{i}", scenario=scenario_name, history=[], scenario_path=str(path),
                          started_at=started, checks=[CheckResult(name="leaks", verdict="failed", summary=leak)])
    _record(summary, i, path, run_dir, result, 1.0, 10.0)
    summary.signatures.clear()
    entry = _sign(summary, opts, i, run_dir, result, summary.runs[-1], "", scenario, {"done": False},
                  tmp_path / "pending.yaml", (("leaks",), "", ()), {}, tmp_path / "out" / "findings", 0.0,
                  lambda _m: None, {})
    assert entry is not None
    return entry


def test_a_known_leak_beside_other_faults_is_reported_known(tmp_path: Path) -> None:
    """Input that showed it: `kvchaos explore --stack compose/reference.yml --jobs 2 --seed 3306`
    (clean stack, 2026-12-06) run 5 (scenario 5: an L1 flush, two preemptions and a 1500 ms
    upstream latency on lmcache-redis) failed `leaks` (lmcache.read_locked_count=6, the chunks of
    the two lookups LMCache logged as abandoned while their prefetch waited for Redis); its shrink
    kept all three fault kinds, and explore reported `checks=leaks | diagnosis=- |
    faults=latency+preempt+tier_flush` as new, though it is slow-l2-read-lock-leak. That finding's
    log mark, logged during the run (not by the run before it on the same stack), makes it known."""
    from chaos.explore.signature import known_findings

    offer = stack_offer(REPO / "compose" / "reference.yml")
    data = generate(offer, 3306, 5)
    assert sorted({f["kind"] for p in data["phases"] for f in p.get("faults", [])}) == ["latency", "preempt", "tier_flush"]
    path = write_scenario(data, tmp_path / "scenarios")
    scenario = check_scenario(path).scenario
    summary = ExploreSummary(explore_id="explore-3306-x", folder=tmp_path / "out", stack=str(offer.path), seed=3306,
                             bugs=[], budget_s=60, max_runs=2, started_at="now")
    opts = ExploreOptions(seed=3306, shrink_budget_s=0, known=known_findings([REPO / "scenarios"]))
    (tmp_path / "out" / "findings").mkdir(parents=True)
    mark = ("\x1b[33;20m[2026-12-06 {t}] LMCache WARNING:\x1b[0m free_lookup_locks for request {r} while its "
            "prefetch is still running; leaving its locks to the prefetch controller "
            "\x1b[3m(lookup.py:427:lmcache.v1.multiprocess.modules.lookup)\x1b[0m")
    for i, (started, lines) in enumerate([
            ("2026-12-06T18:27:48", [mark.format(t="18:27:59,326", r="fault-2-2-1")]),
            # a run whose log holds the mark only from the run before on the same stack
            ("2026-12-06T18:30:00", [mark.format(t="18:27:59,326", r="fault-2-2-1"),
                                     "[2026-12-06 18:30:05,000] LMCache INFO: Stored 512 tokens"])]):
        entry = _sign_leak(tmp_path, summary, opts, scenario, path, i, started, "lmcache.log", lines,
                           "explore-3306-5", "read_locked_count=6")
        assert entry["signature"] == "checks=leaks | diagnosis=- | faults=latency+preempt+tier_flush"
        assert entry["known"] == ("slow-l2-read-lock-leak" if i == 0 else None)


def test_an_end_session_drop_of_the_vllm_stack_beside_a_reset_is_reported_known(tmp_path: Path) -> None:
    """Input that showed it: `kvchaos explore --stack compose/vllm-cpu.yml --jobs 1 --seed 4101`
    (clean vLLM stack, 2026-12-07) run 1 (scenario 1: a 3000 ms downstream latency and a
    reset_peer, both on engine-lmcache) failed `leaks` (lmcache.active_sessions=5): the heartbeat's
    PING answered too late, LMCache's adapter in vLLM logged "LMCache server is unhealthy —
    entering degraded mode" and dropped the END_SESSION of the requests that finished before it
    saw the server healthy again, lookup-timeout's mechanism on vllm-cpu. Its shrink kept both
    fault kinds and explore reported `checks=leaks | diagnosis=- | faults=latency+reset_peer` as
    new. lookup-timeout's log mark, logged during the run, makes it known; without the mark (or
    with it only from the run before on the same stack) it stays new."""
    from chaos.explore.signature import known_findings

    offer = stack_offer(REPO / "compose" / "vllm-cpu.yml")
    data = generate(offer, 4101, 1)
    assert sorted({f["kind"] for p in data["phases"] for f in p.get("faults", [])}) == ["latency", "reset_peer"]
    path = write_scenario(data, tmp_path / "scenarios")
    scenario = check_scenario(path).scenario
    summary = ExploreSummary(explore_id="explore-4101-x", folder=tmp_path / "out", stack=str(offer.path), seed=4101,
                             bugs=[], budget_s=60, max_runs=3, started_at="now")
    opts = ExploreOptions(seed=4101, shrink_budget_s=0, known=known_findings([REPO / "scenarios"]))
    (tmp_path / "out" / "findings").mkdir(parents=True)
    unhealthy = ("\x1b[33;20m[{t}] LMCache WARNING:\x1b[0m LMCache server is unhealthy — entering degraded mode "
                 "\x1b[3m(vllm_multi_process_adapter.py:614:lmcache.integration.vllm.vllm_multi_process_adapter)\x1b[0m")
    healthy = ("\x1b[33;20m[{t}] LMCache WARNING:\x1b[0m LMCache server is healthy again — resuming normal "
               "operation \x1b[3m(vllm_multi_process_adapter.py:608:lmcache.integration.vllm.vllm_multi_process_adapter)\x1b[0m")
    ok = 'INFO:     127.0.0.1:52508 - "POST /v1/completions HTTP/1.1" 200 OK'
    for i, (started, lines, known) in enumerate([
            ("2026-12-07T01:06:38", [unhealthy.format(t="2026-12-07 01:06:42,361"), ok,
                                     healthy.format(t="2026-12-07 01:06:45,249")], "lookup-timeout"),
            # the adapter never held the server unhealthy: not this mechanism
            ("2026-12-07T01:06:38", [ok], None),
            # the mark only from the run before on the same stack
            ("2026-12-07T01:20:00", [unhealthy.format(t="2026-12-07 01:06:42,361"), ok,
                                     healthy.format(t="2026-12-07 01:06:45,249"),
                                     "[2026-12-07 01:20:03,000] LMCache INFO: Engine KV Format"], None)]):
        entry = _sign_leak(tmp_path, summary, opts, scenario, path, i, started, "engine.log", lines,
                           "explore-4101-1", "active_sessions=5")
        assert entry["signature"] == "checks=leaks | diagnosis=- | faults=latency+reset_peer"
        assert entry["known"] == known


def test_a_planted_bug_run_whose_failure_the_clean_engine_shares_is_matched_to_known_findings(tmp_path: Path) -> None:
    """Input that showed it: `benchmarks/explore_planted.py` (seed 1, 2026-12-07) for
    hold-blocks-on-abort and drop-cache-salt: scenario 8 (an upstream `timeout` on lmcache-redis
    with L1 and fs flushed, beside a held retrieve) failed `leaks` with the bug planted, and its
    control on the clean engine failed `leaks` too (read_locked_count=2; LMCache logged the L2
    read-lock leak's mark). A run with a planted bug is never matched to a shipped finding, so
    the stack's own failure was reported as a new signature. The control, a clean-engine run,
    is matched instead: by the marks in its logs and the part of the stack the faults hit."""
    from chaos.explore.explore import _sign
    from chaos.explore.signature import known_findings

    scenario, path, summary, opts = _planted(tmp_path, 1, 8, "hold-blocks-on-abort", max_runs=9,
                                             known=known_findings([REPO / "scenarios"]))
    (tmp_path / "out" / "findings").mkdir(parents=True)
    mark = ("\x1b[33;20m[2026-12-07 17:03:58,629] LMCache WARNING:\x1b[0m free_lookup_locks for request fault-2-0-0 "
            "while its prefetch is still running; leaving its locks to the prefetch controller "
            "\x1b[3m(lookup.py:427:lmcache.v1.multiprocess.modules.lookup)\x1b[0m")
    cases = [  # (the control's outcome, its failed checks, attributed, its lmcache.log, known?)
        ("failed", ["leaks"], False, [mark], True),
        ("failed", ["leaks"], False, ["[2026-12-07 17:03:59,000] LMCache INFO: Stored 512 tokens"], False),
        ("passed", [], True, [mark], False),  # the bug's: never an upstream finding
    ]
    for i, (outcome, failed, attributed, lines, known) in enumerate(cases):
        run_dir = tmp_path / "runs" / f"r{i}"
        (run_dir / "logs").mkdir(parents=True)
        (run_dir / "logs" / "lmcache.log").write_text(mark + "\n")  # the planted run logged it too
        cdir = run_dir / "control" / f"c{i}"
        (cdir / "logs").mkdir(parents=True)
        (cdir / "logs" / "lmcache.log").write_text("\n".join(lines) + "\n")
        (cdir / "result.json").write_text(json.dumps({"started_at": "2026-12-07T17:03:42"}))
        result = build_result(run_id=f"r{i}", scenario="explore-1-8", history=[], scenario_path=str(path),
                              started_at="2026-12-07T17:03:42", engine_bugs=["hold-blocks-on-abort"],
                              checks=[CheckResult(name="leaks", verdict="failed", summary="read_locked_count=2")])
        _record(summary, i, path, run_dir, result, 1.0, 10.0)
        summary.signatures.clear()
        probe = {"clean_engine": outcome, "clean_engine_failed_checks": failed, "clean_engine_run_dir": str(cdir),
                 "attributed_to_bug": attributed, "faults_irrelevant": "control" if attributed else None}
        entry = _sign(summary, opts, i, run_dir, result, summary.runs[-1], "", scenario, {"done": False},
                      tmp_path / "pending.yaml", (("leaks",), "", ()), {}, tmp_path / "out" / "findings", 0.0,
                      lambda _m: None, probe)
        assert entry is not None
        if known:
            assert entry["known"] in ("frozen-l2-read-lock-leak", "slow-l2-read-lock-leak",
                                      "frozen-l2-locks-outlive-read-ttl"), entry["known"]
        else:
            assert entry["known"] is None, (i, entry["known"])


def test_a_planted_leak_beside_the_stacks_own_leak_is_credited_to_the_bug(tmp_path: Path, monkeypatch) -> None:
    """Seed 1 scenario 2 (an L2 fault beside hold-blocks-on-abort's dealt window) failed `leaks`
    with the bug planted, and its control on the clean engine failed `leaks` too, with LMCache's
    L2 read-lock leak alone: the control compared check names, so the bug's own leak (engine
    blocks held) was never credited to it. The control now compares what leaked: a field the
    clean engine did not leak is the bug's; the same fields are the stack's own failure."""
    import chaos.explore.explore as explore
    from chaos.explore.explore import same_failure

    l2 = frozenset({"lmcache.read_locked_count"})
    both = l2 | {"engine.blocks_held_by_requests"}
    assert not same_failure(("leaks",), both, ["leaks"], l2)  # the bug leaked more: its own
    assert same_failure(("leaks",), l2, ["leaks"], both)  # the clean engine leaks it too
    assert same_failure(("leaks",), frozenset(), ["leaks"], l2)  # fields unknown: the check's name
    assert same_failure(("recompute_equivalence",), both, ["recompute_equivalence"], frozenset())
    assert not same_failure(("leaks",), l2, ["liveness"], frozenset())

    _scenario, path, _summary, opts = _planted(tmp_path, 1, 2, "hold-blocks-on-abort", max_runs=3)
    for control_leaked, attributed in ((l2, True), (both, False)):
        cdir = tmp_path / "control" / str(attributed)
        monkeypatch.setattr(explore, "_rerun", lambda *a, cl=control_leaked, cd=cdir, **k: ("failed", ["leaks"], cl, cd))
        probe = explore._control(path, ("leaks",), both, None, opts, tmp_path, 2, lambda _m: None)
        assert probe["attributed_to_bug"] is attributed
        assert probe["clean_engine_leaked"] == sorted(control_leaked)
        assert probe["faults_irrelevant"] == ("control" if attributed else None)
