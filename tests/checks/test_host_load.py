"""The host-load rule (chaos/checks/host_load.py) through liveness and slo, from constructed
histories: one test per branch of the rule."""

from chaos.checks import Snapshots, host_load, liveness, slo
from chaos.checks.snapshots import TwinBaseline, TwinTiming

P = [1, 2, 3]
Q = [4, 5, 6]


def twin(**timings: TwinTiming) -> Snapshots:
    return Snapshots(twin_baseline=TwinBaseline(concurrency=4, timings=timings))


def ok(latency: float, ttft: float | None = None) -> TwinTiming:
    return TwinTiming(outcome="ok", latency_s=latency, ttft_s=ttft, waited_s=31.0)


def loaded_warm(hb, n_peers: int = 4, peer_s: float = 24.0) -> None:
    """A warm phase on a loaded host: peers just under the 30 s deadline, one given up on at it."""
    for i in range(n_peers):
        hb.request(f"w-{i}", Q, [1], t0=i * 0.1, t1=i * 0.1 + peer_s)
    hb.request("w-late", P, [], outcome="info", error="deadline exceeded", t0=1.0, t1=31.05)


def test_late_while_twin_as_slow_is_host_load_with_figures(hb):
    loaded_warm(hb)
    r = liveness.check(hb.ops, twin(**{"w-late": ok(21.0)}), {"request_deadline_s": 30})
    assert r.verdict == "unknown", r.summary
    assert "host load" in r.summary and "twin took 21.0s" in r.summary
    row = r.details["host_load"][0]
    assert row["request_id"] == "w-late" and row["twin_s"] == 21.0 and row["twin_ratio"] < host_load.K_TWIN
    assert r.details["failed"] == [] and r.details["late"] == []


def test_late_while_twin_fast_is_failed(hb):
    """Stuck while the twin answers: the twin took 3 s for the prompt the stack left 30 s."""
    loaded_warm(hb)  # even with slow peers: the twin, asked the same prompt, decides
    r = liveness.check(hb.ops, twin(**{"w-late": ok(3.0)}), {"request_deadline_s": 30})
    assert r.verdict == "failed", r.summary
    assert "while the recompute twin answered the same prompt in 3.00s" in r.summary
    assert r.details["late"][0]["verdict"] == "failed" and r.details["failed"] == ["w-late"]


def test_twin_gave_no_answer_within_the_late_time_is_host_load(hb):
    loaded_warm(hb, n_peers=0)
    timing = TwinTiming(outcome="info", error="deadline exceeded", waited_s=31.05)
    r = liveness.check(hb.ops, twin(**{"w-late": timing}), {"request_deadline_s": 30})
    assert r.verdict == "unknown" and r.details["host_load"][0]["twin_timed_out"] is True


def test_without_twin_slow_peers_are_host_load_fast_peers_fail(hb):
    loaded_warm(hb, n_peers=4, peer_s=24.0)
    r = liveness.check(hb.ops, Snapshots(), {"request_deadline_s": 30})
    assert r.verdict == "unknown", r.summary
    assert r.details["host_load"][0]["peers"] == 4 and r.details["host_load"][0]["peers_median_s"] == 24.0

    hb2 = type(hb)()
    loaded_warm(hb2, n_peers=4, peer_s=2.0)
    r = liveness.check(hb2.ops, Snapshots(), {"request_deadline_s": 30})
    assert r.verdict == "failed" and "no baseline as slow" in r.summary


def test_too_few_peers_and_no_twin_fails(hb):
    loaded_warm(hb, n_peers=host_load.MIN_PEERS - 1)
    assert liveness.check(hb.ops, Snapshots(), {"request_deadline_s": 30}).verdict == "failed"


def test_never_completed_fails_even_with_the_twin_slow(hb):
    loaded_warm(hb)
    hb.request("w-never", P, t0=2.0, t1=None)
    r = liveness.check(hb.ops, twin(**{"w-late": ok(25.0), "w-never": ok(25.0)}), {"request_deadline_s": 30})
    assert r.verdict == "failed" and "never completed (first: w-never)" in r.summary


def test_unexplained_exit_fails_even_when_late_is_host_load(hb):
    from chaos.checks import ServiceExit

    loaded_warm(hb)
    snaps = twin(**{"w-late": ok(21.0)})
    snaps.service_exits = [ServiceExit(service="engine", time=3.0, returncode=1)]
    assert liveness.check(hb.ops, snaps, {"request_deadline_s": 30}).verdict == "failed"


def stalled_phase(hb) -> None:
    """A phase with a latency fault overlapping the late request's life (peers just under 30 s)."""
    for i in range(4):
        hb.request(f"s-{i}", Q, [1], t0=i * 0.1, t1=25.0, phase="stall")
    hb.request("s-late", P, [], outcome="info", error="deadline exceeded", t0=1.0, t1=31.05, phase="stall")
    hb.fault("lat-1", "latency", 10.0, 15.0, {"bit": True})


def test_fault_in_place_with_the_twin_fast_is_the_faults_effect(hb):
    """A fault overlapping the late request's life and the twin fast for its prompt: late."""
    stalled_phase(hb)
    r = liveness.check(hb.ops, twin(**{"s-late": ok(3.0)}), {"request_deadline_s": 30})
    assert r.verdict == "failed"
    row = r.details["late"][0]
    assert row["verdict"] == "fault" and "lat-1" in row["reason"] and "3.00s" in row["reason"]
    # the runner times the twin for it: only the twin can excuse it
    assert [x.request_id for x in liveness.slow_requests(hb.ops, {"request_deadline_s": 30})] == ["s-late"]


def test_fault_in_place_without_a_twin_figure_is_judged_as_before_peers_not_asked(hb):
    """Slow peers under the same fault excuse nothing: the fault may have slowed them all."""
    stalled_phase(hb)
    r = liveness.check(hb.ops, Snapshots(), {"request_deadline_s": 30})
    assert r.verdict == "failed"
    assert r.details["late"][0]["verdict"] == "fault" and r.details["host_load"] == []


def test_fault_in_place_with_the_twin_as_slow_is_host_load(hb):
    """Input: l2-partial-read at load average 20-27 (three catalogue runs beside 8 busy loops,
    2026-12-07): the first requests under the cut Redis link were given up on at 30 s while they
    were still being computed (LMCache stored their chunks 13-30 s into the phase). The twin,
    which no fault touches, took 14 s for such a prompt on that host: host load, not failed
    (it was failed, verdict "fault", whatever the twin said)."""
    stalled_phase(hb)
    r = liveness.check(hb.ops, twin(**{"s-late": ok(14.0)}), {"request_deadline_s": 30})
    assert r.verdict == "unknown", r.summary
    row = r.details["host_load"][0]
    assert row["request_id"] == "s-late" and row["faults"] == ["lat-1"] and row["twin_s"] == 14.0
    assert "lat-1 in place" in row["reason"] and "which no fault touches" in row["reason"]
    assert r.details["failed"] == [] and r.details["late"] == []
    timing = TwinTiming(outcome="info", error="deadline exceeded", waited_s=31.05)
    r = liveness.check(hb.ops, twin(**{"s-late": timing}), {"request_deadline_s": 30})
    assert r.verdict == "unknown" and r.details["host_load"][0]["twin_timed_out"] is True


def test_warm_request_given_up_at_the_deadline_at_2_2x_the_twin_is_host_load(hb):
    """Input: abort-during-lookup, the first scenario on a fresh stack at load average 20-27
    (2026-12-07): warm requests with no fault in place given up on at 30 s while the twin took
    13.7 s for the same prompts (x2.2, a lower bound: they were cut at the deadline). Failed
    with K_TWIN = 2; a stuck request (x3.5 here) still fails."""
    loaded_warm(hb, n_peers=0)
    r = liveness.check(hb.ops, twin(**{"w-late": ok(13.7)}), {"request_deadline_s": 30})
    assert r.verdict == "unknown", r.summary
    assert abs(r.details["host_load"][0]["twin_ratio"] - 30.05 / 13.7) < 1e-9
    r = liveness.check(hb.ops, twin(**{"w-late": ok(8.8)}), {"request_deadline_s": 30})
    assert r.verdict == "failed" and r.details["late"][0]["verdict"] == "failed"


def test_fault_before_the_request_is_not_in_place(hb):
    hb.fault("lat-1", "latency", 0.0, 0.5, {"bit": True})
    loaded_warm(hb)
    assert [r.request_id for r in liveness.slow_requests(hb.ops, {"request_deadline_s": 30})] == ["w-late"]
    assert liveness.check(hb.ops, twin(**{"w-late": ok(20.0)}), {"request_deadline_s": 30}).verdict == "unknown"


def test_late_ok_completion_far_past_the_twin_fails(hb):
    """Completed, but at 45 s while the twin took 10 s (x4.5)."""
    loaded_warm(hb, n_peers=0)
    hb.request("w-slow-ok", Q, [1], t0=2.0, t1=47.0)
    r = liveness.check(hb.ops, twin(**{"w-late": ok(20.0), "w-slow-ok": ok(10.0)}), {"request_deadline_s": 30})
    assert r.verdict == "failed"
    assert [x["request_id"] for x in r.details["late"]] == ["w-slow-ok"]
    assert [x["request_id"] for x in r.details["host_load"]] == ["w-late"]


def test_slo_bound_exceeded_by_host_load_is_unknown_and_by_stuck_request_failed(hb):
    for i in range(6):
        hb.request(f"w-{i}", Q, [1], t0=i, t1=i + 50.0)
    cfg = {"latency": {"any": {"p99": 45}}}
    assert [r.request_id for r in slo.slow_requests(hb.ops, cfg)] == [f"w-{i}" for i in range(6)]
    slow = twin(**{f"w-{i}": ok(40.0) for i in range(6)})
    r = slo.check(hb.ops, slow, cfg)
    assert r.verdict == "unknown" and "host load" in r.summary, r.summary
    assert r.details["latency"]["any"]["p99"]["over_bound"][0]["twin_s"] == 40.0
    fast = twin(**{f"w-{i}": ok(40.0) for i in range(5)}, **{"w-5": ok(5.0)})
    r = slo.check(hb.ops, fast, cfg)
    assert r.verdict == "failed"
    rows = r.details["latency"]["any"]["p99"]["over_bound"]
    assert [j["verdict"] for j in rows if j["request_id"] == "w-5"] == ["failed"]


def test_slo_with_a_fault_in_place_is_host_load_only_on_a_slow_twin(hb):
    for i in range(6):
        hb.request(f"s-{i}", Q, [1], t0=i, t1=i + 50.0, phase="stall")
    hb.fault("lat-1", "latency", 0.0, 60.0, {"bit": True})
    cfg = {"latency": {"any": {"p99": 45}}}
    assert len(slo.slow_requests(hb.ops, cfg)) == 6  # the twin is timed for them too
    r = slo.check(hb.ops, twin(**{f"s-{i}": ok(10.0) for i in range(6)}), cfg)
    assert r.verdict == "failed"
    assert slo.check(hb.ops, Snapshots(), cfg).verdict == "failed"
    r = slo.check(hb.ops, twin(**{f"s-{i}": ok(40.0) for i in range(6)}), cfg)
    assert r.verdict == "unknown" and "host load" in r.summary, r.summary


def test_host_load_excuses_the_lateness_not_an_error_that_came_late(hb):
    loaded_warm(hb)
    hb.request("w-err", Q, [], outcome="fail", error="HTTP 500: load failed", t0=2.0, t1=33.0)
    r = liveness.check(hb.ops, twin(**{"w-late": ok(21.0), "w-err": ok(20.0)}), {"request_deadline_s": 30})
    assert r.verdict == "failed" and "HTTP 500: load failed" in r.summary
    assert {x["request_id"] for x in r.details["host_load"]} == {"w-late", "w-err"}
    assert r.details["failed"] == ["w-err"]


def test_a_late_request_the_twin_was_not_timed_on_takes_its_phases_twin_figure(hb):
    """Input: cancel-storm at load average 29 (three catalogue runs beside 8 busy loops,
    2026-12-07): 10 warm requests given up on at 30 s; the runner timed the twin on the 8
    slowest (at most 2 x concurrency), which gave no answer within 31 s for any, and the 2 left
    untimed, judged on peers (none: all late), failed liveness."""
    for i in range(10):
        hb.request(f"w-{i}", P if i % 2 else Q, [], outcome="info", error="deadline exceeded",
                   t0=i * 0.01, t1=30.05 + i * 0.01)
    slow = TwinTiming(outcome="info", error="deadline exceeded", waited_s=31.1)
    timed = twin(**{f"w-{i}": slow for i in range(8)})
    r = liveness.check(hb.ops, timed, {"request_deadline_s": 30})
    assert r.verdict == "unknown", r.summary
    rows = {x["request_id"]: x for x in r.details["host_load"]}
    assert set(rows) == {f"w-{i}" for i in range(10)}
    assert "8 other prompt(s) of phase warm" in rows["w-9"]["reason"] and rows["w-9"]["twin_timed_out"]
    # the fastest answer of the phase decides: one timed prompt answered in 5 s -> stuck (x6)
    fast = twin(**{f"w-{i}": slow for i in range(7)}, **{"w-7": ok(5.0)})
    r = liveness.check(hb.ops, fast, {"request_deadline_s": 30})
    assert r.verdict == "failed"
    assert {x["request_id"] for x in r.details["late"]} == {"w-7", "w-8", "w-9"}
    # another phase's figures are not used
    other = twin(**{"x-0": ok(25.0)})
    hb.request("x-0", P, [1], t0=40.0, t1=45.0, phase="other")
    r = liveness.check(hb.ops, other, {"request_deadline_s": 30})
    assert r.verdict == "failed"
