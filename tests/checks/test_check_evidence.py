from chaos.checks import Snapshots, evidence


def test_every_fault_bit_passes(hb):
    hb.fault("f1", "latency", 1, 5, {"bit": True, "connections": 3})
    hb.fault("f2", "reset_peer", 6, 8, {"bit": True})
    r = evidence.check(hb.ops, Snapshots(), {})
    assert r.verdict == "passed"
    assert [f["bit"] for f in r.details["faults"]] == [True, True]


def test_fault_that_did_not_bite_is_inconclusive_never_passed(hb):
    hb.fault("f1", "latency", 1, 5, {"bit": True})
    hb.fault("f2", "latency", 6, 8, {"bit": False, "connections": 0})
    r = evidence.check(hb.ops, Snapshots(), None)
    assert r.verdict == "unknown"
    assert "f2" in r.summary and "did not bite" in r.summary


def test_missing_evidence_failed_apply_and_unhealed_are_inconclusive(hb):
    hb.fault("f1", "latency", 1, 5, None)
    assert evidence.check(hb.ops, Snapshots(), {}).verdict == "unknown"
    b2 = type(hb)()
    b2.fault("f2", "latency", 1, 5, {"bit": True}, apply_outcome="fail")
    r = evidence.check(b2.ops, Snapshots(), {})
    assert r.verdict == "unknown" and "apply fail" in r.summary
    b3 = type(hb)()
    b3.fault("f3", "latency", 1, None, None)
    assert "never healed" in evidence.check(b3.ops, Snapshots(), {}).summary


def test_bit_must_be_true_not_truthy(hb):
    hb.fault("f1", "latency", 1, 5, {"bit": "yes"})
    assert evidence.check(hb.ops, Snapshots(), {}).verdict == "unknown"


def test_no_faults_passes(hb):
    hb.request("w-1", [1, 2], [3])
    assert evidence.check(hb.ops, Snapshots(), {}).verdict == "passed"
