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
