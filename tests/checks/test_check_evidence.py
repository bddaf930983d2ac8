from chaos.checks import Snapshots, evidence


def test_every_fault_bit_passes(hb):
    hb.request("w-1", [1, 2], [3], t0=0.5, t1=9.0)  # in flight while each toxic was in place
    hb.fault("f1", "latency", 1, 5, {"bit": True, "connections": 3})
    hb.fault("f2", "reset_peer", 6, 8, {"bit": True})
    r = evidence.check(hb.ops, Snapshots(), {})
    assert r.verdict == "passed"
    assert [f["bit"] for f in r.details["faults"]] == [True, True]


def test_fault_that_did_not_bite_is_inconclusive_never_passed(hb):
    hb.request("w-1", [1, 2], [3], t0=0.5, t1=9.0)
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


def _problems(ops):
    return [f["problem"] for f in evidence.check(ops, Snapshots(), {}).details["faults"]]


def test_each_reason_a_fault_did_not_bite_is_named(hb):
    hb.fault("f1", "latency", 1, 5, {"bit": False, "connections": 0, "why": "idle"})
    hb.fault("f2", "latency", 1, 5, {"bit": False})
    hb.fault("f3", "latency", 1, 5, None)
    hb.fault("f4", "latency", 1, None, None)
    hb.fault("f5", "latency", 1, 5, {"bit": True}, apply_outcome="fail")
    hb.op("nemesis", "info", "apply", 1.0, fault_id="f6", value={"kind": "pause"})
    hb.op("nemesis", "ok", "heal", 2.0, fault_id="f7", value={"kind": "kill", "evidence": {"bit": True}})
    hb.fault("f8", "latency", 1, 5, {"bit": True})
    hb.request("w-1", [1, 2], [3], t0=0.5, t1=9.0)
    assert _problems(hb.ops) == [
        "did not bite (connections=0, why=idle)", "did not bite", "no evidence recorded",
        "never healed, no evidence recorded", "apply fail: proxy said 500", "apply info",
        None, "never applied"]  # in order of first op: f8's apply (t=1) precedes f7's heal (t=2)


def test_inconclusive_summary_names_the_first_dull_fault(hb):
    hb.fault("f1", "latency", 1, 5, {"bit": True})
    hb.fault("f2", "reset_peer", 6, 8, {"bit": False}, phase="p2")
    hb.fault("f3", "latency", 6, 8, None)
    hb.request("w-1", [1, 2], [3], t0=0.5, t1=9.0)
    r = evidence.check(hb.ops, Snapshots(), {})
    assert r.summary == ("inconclusive: faults acted: 1 of 3; triggers reached: 3 of 3 (3 the kind's default); "
                         "reset_peer f2 (phase p2): did not bite")
    row = r.details["faults"][1]
    assert (row["fault_id"], row["kind"], row["phase"], row["applied_at"], row["healed_at"], row["bit"]) == (
        "f2", "reset_peer", "p2", 6.01, 8.01, False)
    assert row["evidence"] == {"bit": False}


def test_a_fault_named_as_its_kind_is_shown_once(hb):
    hb.fault("pause", "pause", 1, 5, {"bit": False})
    r = evidence.check(hb.ops, Snapshots(), {})
    assert "; pause (phase stall): did not bite" in r.summary


def test_passing_summary_lists_the_faults(hb):
    hb.request("w-1", [1, 2], [3], t0=0.5, t1=9.0)
    hb.fault("f1", "latency", 1, 5, {"bit": True})
    hb.fault("f2", "latency", 6, 8, {"bit": True})
    r = evidence.check(hb.ops, Snapshots(), {})
    assert r.summary == "faults acted: 2 of 2 (f1, f2); triggers reached: 2 of 2 (2 the kind's default)"
    assert evidence.check([], Snapshots(), {}).summary == "no faults and no trigger in this scenario"
def _trigger(reached: bool, increase: float = 0.0) -> dict:
    return {"reached": reached, "window_s": 2.0, "conditions": [
        {"condition": "lmcache metric lmcache_mp_l2_prefetch_failure_chunks_total grew by >= 1",
         "probe": "metric", "reached": reached, "increase": increase, "want_increase": 1, "samples": 9}]}


def test_acted_and_trigger_reached_are_reported_separately(hb):
    hb.fault("f1", "l2_corrupt", 1, 5, {"bit": True, "corrupted": 4}, trigger=_trigger(True, 3))
    hb.fault("f2", "latency", 6, 8, {"bit": True})
    hb.request("w-1", [1, 2], [3], t0=5.5, t1=9.0)
    r = evidence.check(hb.ops, Snapshots(), {})
    assert r.verdict == "passed"
    assert "faults acted: 2 of 2" in r.summary and "triggers reached: 2 of 2 (1 the kind's default)" in r.summary
    rows = {f["fault_id"]: f for f in r.details["faults"]}
    assert rows["f1"]["acted"] is True and rows["f1"]["trigger_reached"] is True
    assert rows["f2"]["trigger_reached"] is True and rows["f2"]["default_trigger"]["default"] == "latency"


def test_fault_that_acted_but_missed_its_trigger_is_inconclusive(hb):
    """The hollow pass of issue 12: objects were deleted (the fault acted) but no read failed."""
    hb.fault("f1", "l2_corrupt", 1, 5, {"bit": True, "corrupted": 4}, trigger=_trigger(False))
    r = evidence.check(hb.ops, Snapshots(), {})
    assert r.verdict == "unknown"
    assert "faults acted: 1 of 1" in r.summary and "triggers reached: 0 of 1" in r.summary
    assert "not reached (increase 0)" in r.summary
    assert r.details["faults"][0]["acted"] is True and r.details["faults"][0]["trigger_reached"] is False


def test_phase_trigger_not_reached_is_inconclusive_even_without_faults(hb):
    hb.request("w-1", [1, 2], [3], phase="hit")
    hb.phase_trigger("hit", 2.0, _trigger(False))
    r = evidence.check(hb.ops, Snapshots(), {})
    assert r.verdict == "unknown" and "phase hit: trigger" in r.summary
    b2 = type(hb)()
    b2.phase_trigger("hit", 2.0, _trigger(True, 5))
    r2 = evidence.check(b2.ops, Snapshots(), {})
    assert r2.verdict == "passed" and "triggers reached: 1 of 1" in r2.summary
