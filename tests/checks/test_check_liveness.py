from chaos.checks import ServiceExit, Snapshots, liveness

P = [1, 2, 3]


def test_all_requests_end_in_time_passes(hb):
    hb.request("w-1", P, [1], t0=0, t1=2)
    hb.request("w-2", P, [1], t0=1, t1=2.5, process="client-1")
    r = liveness.check(hb.ops, Snapshots(), {"request_deadline_s": 30})
    assert r.verdict == "passed", r.summary


def test_request_never_completed_fails(hb):
    hb.request("w-1", P, [1])
    hb.request("w-2", P, t0=1, t1=None)
    r = liveness.check(hb.ops, Snapshots(), {})
    assert r.verdict == "failed"
    assert r.details["never_completed"] == ["w-2"]
    assert "1 request(s) never completed (first: w-2)" in r.summary


def test_late_completion_fails(hb):
    hb.request("w-1", P, [1], t0=0, t1=45)
    r = liveness.check(hb.ops, Snapshots(), {"request_deadline_s": "30s"})
    assert r.verdict == "failed" and r.details["late"][0]["request_id"] == "w-1"


def test_errors_within_allowed_fraction_pass_beyond_fail(hb):
    for i in range(9):
        hb.request(f"w-{i}", P, [1], t0=i, t1=i + 0.5)
    hb.request("w-9", P, outcome="fail", error="HTTP 500: load failed", t0=9, t1=9.5)
    assert liveness.check(hb.ops, Snapshots(), {"allow_failed_fraction": 0.1}).verdict == "passed"
    r = liveness.check(hb.ops, Snapshots(), {"allow_failed_fraction": 0.0})
    assert r.verdict == "failed" and "HTTP 500: load failed" in r.summary


def test_abort_on_purpose_is_not_a_failure_but_deadline_info_is(hb):
    hb.request("w-1", P, [1])
    hb.request("w-2", P, outcome="info", aborted=True, error="aborted by client after 50 ms", t0=1, t1=1.05)
    assert liveness.check(hb.ops, Snapshots(), {}).verdict == "passed"
    hb.request("w-3", P, outcome="info", error="deadline exceeded", t0=2, t1=3)
    r = liveness.check(hb.ops, Snapshots(), {})
    assert r.verdict == "failed" and r.details["failed"] == ["w-3"]


def test_service_death_without_fault_fails_but_killed_by_fault_passes(hb):
    hb.request("w-1", P, [1])
    killed = ServiceExit(service="lmcache", time=5.0, returncode=-9, killed_by_fault=True)
    assert liveness.check(hb.ops, Snapshots(service_exits=[killed]), {}).verdict == "passed"
    died = ServiceExit(service="engine", time=6.0, returncode=1, killed_by_fault=False)
    r = liveness.check(hb.ops, Snapshots(service_exits=[killed, died]), {})
    assert r.verdict == "failed"
    assert "service engine exited (returncode 1) at t=6.0s and no fault killed it" in r.summary


def test_no_requests_is_unknown():
    assert liveness.check([], Snapshots(), {}).verdict == "unknown"


def _fail_load_run(hb, extra_error_phase: str | None = None):
    """Four warm requests, two requests failing while the retrieve_fail fault is in place
    (policy fail), two recovering ones; optionally one more error elsewhere."""
    for i in range(4):
        hb.request(f"w-{i}", P, [1], t0=i, t1=i + 0.5)
    hb.fault("fail-retrieves", "retrieve_fail", 10, 20, {"failed": 2}, phase="fail-load", params={})
    hb.request("f-0", P, outcome="fail", error="HTTP 500: KV load failed", t0=11, t1=12, phase="fail-load")
    hb.request("f-1", P, outcome="fail", error="HTTP 500: KV load failed", t0=11, t1=12.5, phase="fail-load")
    for i in range(2):
        hb.request(f"r-{i}", P, [1], t0=25 + i, t1=25.5 + i, phase="recover")
    if extra_error_phase:
        hb.request("x-0", P, outcome="fail", error="HTTP 500: boom", t0=30, t1=30.5, phase=extra_error_phase)


def test_allowed_failures_name_the_requests_that_may_fail(hb):
    """The authoring gap of issue 34: `allow_failed_fraction: 0.34` let ANY third of the requests
    fail; allowed_failures names the ones whose load failed (the fault in place), and an error
    anywhere else still fails liveness, however small its fraction."""
    _fail_load_run(hb)
    rule = {"allowed_failures": [{"fault": "fail-retrieves", "phase": "fail-load", "at_most": 2}]}
    r = liveness.check(hb.ops, Snapshots(), rule)
    assert r.verdict == "passed", r.summary
    assert r.details["allowed_failures"] == {"f-0": "allowed_failures[0]", "f-1": "allowed_failures[0]"}
    assert "2 allowed by allowed_failures" in r.summary
    hb.request("x-0", P, outcome="fail", error="HTTP 500: boom", t0=30, t1=30.5, phase="recover")
    r = liveness.check(hb.ops, Snapshots(), rule)
    assert r.verdict == "failed" and "x-0" in r.summary and r.details["failed"] == ["x-0"]
    # the old way passed the same run: one error in nine is under a third
    assert liveness.check(hb.ops, Snapshots(), {"allow_failed_fraction": 0.34}).verdict == "passed"


def test_allowed_failures_by_error_text_and_at_most(hb):
    _fail_load_run(hb)
    assert liveness.check(hb.ops, Snapshots(), {"allowed_failures": [{"error_matches": "KV load"}]}).verdict == "passed"
    r = liveness.check(hb.ops, Snapshots(), {"allowed_failures": [{"error_matches": "KV load", "at_most": 1}]})
    assert r.verdict == "failed", r.summary
    assert "allowed_failures[0] matched 2 failed requests, at most 1 allowed" in r.summary
    # a fault that was not in place during the request's life excuses nothing
    r = liveness.check(hb.ops, Snapshots(), {"allowed_failures": [{"phase": "recover"}]})
    assert r.verdict == "failed" and r.details["failed"] == ["f-0", "f-1"]


def test_phase_deadlines_scope_the_deadline(hb):
    """The liveness deadline per phase: a 10 s request passes a 30 s global deadline but fails
    a 5 s deadline on its own phase; a 40 s request of a phase allowed 60 s passes."""
    hb.request("w-0", P, [1], t0=0, t1=10, phase="warm")
    hb.request("s-0", P, [1], t0=20, t1=60, phase="stall")
    cfg = {"request_deadline_s": 30, "phase_deadlines": [{"phase": "stall", "request_deadline_s": "60s"}]}
    assert liveness.check(hb.ops, Snapshots(), cfg).verdict == "passed"
    assert liveness.check(hb.ops, Snapshots(), {"request_deadline_s": 30}).verdict == "failed"
    cfg["phase_deadlines"].append({"phase": "warm", "request_deadline_s": 5})
    r = liveness.check(hb.ops, Snapshots(), cfg)
    assert r.verdict == "failed" and r.details["late"][0]["request_id"] == "w-0" and "> 5s" in r.summary
