"""Each fault kind's default trigger (chaos/faults/base.py DefaultTrigger), judged by the
`evidence` check from recorded histories: reached, and not reached, for every kind; the
runner's record of the default is used as is; `trigger: none` leaves the window unproven."""

from __future__ import annotations

import pytest

from chaos.checks import Snapshots, evidence
from chaos.faults import registry

registry.load_builtin_faults()

#: Kinds whose default is a request of the workload in flight while the fault was in place.
IN_PLACE = ["latency", "timeout", "bandwidth", "slicer", "limit_data", "reset_peer", "link_down", "pause"]
#: Kinds whose default is a request in flight when the fault took effect or sent after it.
FROM_APPLY = ["kill", "tier_flush"]
#: Kinds whose own evidence is the window.
EVIDENCE = ["stall", "retrieve_fail", "preempt", "l2_fault_inject", "lmcache_call", "hook", "cancel"]

PARAMS = {
    "latency": {"link": "l", "latency_ms": 100, "duration": 4}, "timeout": {"link": "l", "duration": 4},
    "bandwidth": {"link": "l", "rate_kbps": 1, "duration": 4}, "slicer": {"link": "l", "average_size": 8, "duration": 4},
    "limit_data": {"link": "l", "bytes": 10, "duration": 4}, "reset_peer": {"link": "l", "duration": 4},
    "link_down": {"link": "l", "duration": 4}, "pause": {"service": "lmcache", "duration": 4},
    "kill": {"service": "lmcache", "duration": 4}, "tier_flush": {"tiers": ["l1"], "duration": 4},
    "stall": {"point": "before_lookup", "seconds": 1, "duration": 4},
    "retrieve_fail": {"duration": 4}, "preempt": {"duration": 4}, "l2_fault_inject": {"rate": 0.5, "duration": 4},
    "lmcache_call": {"call": "free_lookup_locks", "request_id": "x", "duration": 4},
    "hook": {"service": "engine", "apply": {"argv": ["true"]}, "duration": 4},
    "cancel": {"mode": "after_ms", "after_ms": 100, "duration": 4},
    "disk_full": {"duration": 4}, "l2_corrupt": {"mode": "delete", "duration": 4},
}


def test_every_kind_has_a_default_and_the_table_covers_it():
    assert sorted(IN_PLACE + FROM_APPLY + EVIDENCE + ["disk_full", "l2_corrupt"]) == registry.kinds()
    for kind in registry.kinds():
        cls = registry.get(kind)
        params = cls.params_model.model_validate({"kind": kind, **PARAMS[kind]})
        d = cls.default_trigger(params)
        want = ("requests_in_place" if kind in IN_PLACE else "requests_from_apply" if kind in FROM_APPLY
                else "evidence")
        assert d.basis == want, kind
        assert d.text and d.as_record(kind)["kind"] == kind


def _row(hb) -> dict:
    r = evidence.check(hb.ops, Snapshots(), {})
    (row,) = r.details["faults"]
    return r, row


@pytest.mark.parametrize("kind", IN_PLACE)
def test_in_place_default_reached_by_a_request_in_flight_while_in_place(hb, kind):
    hb.request("before", [1], [2], t0=0.0, t1=0.5)           # done before the apply
    hb.request("during", [1], [2], t0=2.0, t1=7.0, phase="stall")  # answered after the heal
    hb.fault("f", kind, 1, 5, {"bit": True}, params=PARAMS[kind])
    r, row = _row(hb)
    assert r.verdict == "passed", r.summary
    assert row["default_trigger"]["reached"] is True and row["default_trigger"]["request_ids"] == ["during"]
    assert "triggers reached: 1 of 1 (1 the kind's default)" in r.summary


@pytest.mark.parametrize("kind", IN_PLACE)
def test_in_place_default_not_reached_when_no_request_met_the_fault(hb, kind):
    """The fault acted (heartbeats crossed the link) but no request of the workload was in flight
    while it was in place: before it, and after its heal."""
    hb.request("before", [1], [2], t0=0.0, t1=0.9)
    hb.request("after", [1], [2], t0=5.5, t1=6.0)
    hb.fault("f", kind, 1, 5, {"bit": True}, params=PARAMS[kind])
    r, row = _row(hb)
    assert r.verdict == "unknown"
    assert f"trigger (default for {kind}) not reached" in r.summary
    assert "no request of the workload was in flight while it was in place" in r.summary
    assert row["acted"] is True and row["trigger_reached"] is False


@pytest.mark.parametrize("kind", FROM_APPLY)
def test_from_apply_default_reached_by_a_request_in_a_later_phase(hb, kind):
    hb.fault("f", kind, 1, 2, {"bit": True}, params=PARAMS[kind])
    hb.request("later", [1], [2], t0=10.0, t1=11.0, phase="recover")
    r, row = _row(hb)
    assert r.verdict == "passed", r.summary
    assert row["default_trigger"]["request_ids"] == ["later"]


@pytest.mark.parametrize("kind", FROM_APPLY)
def test_from_apply_default_not_reached_when_no_request_came_after(hb, kind):
    hb.request("before", [1], [2], t0=0.0, t1=0.9)
    hb.fault("f", kind, 1, 2, {"bit": True}, params=PARAMS[kind])
    r, row = _row(hb)
    assert r.verdict == "unknown"
    assert "no request of the workload was in flight when it took effect or after" in r.summary


@pytest.mark.parametrize("kind", EVIDENCE)
def test_evidence_default_follows_the_fault_s_own_evidence(hb, kind):
    hb.fault("f", kind, 1, 5, {"bit": True}, params=PARAMS[kind])
    r, row = _row(hb)
    assert r.verdict == "passed" and row["default_trigger"]["reached"] is True, r.summary
    b2 = type(hb)()
    b2.fault("f", kind, 1, 5, {"bit": False}, params=PARAMS[kind])
    r2, row2 = _row(b2)
    assert r2.verdict == "unknown" and row2["default_trigger"]["reached"] is False


def test_disk_full_default_needs_stores_lmcache_counted_as_failed(hb):
    hb.fault("f", "disk_full", 1, 5, {"bit": True, "source": "lmcache /metrics", "failed_store_chunks": 3},
             params=PARAMS["disk_full"])
    assert _row(hb)[0].verdict == "passed"
    b2 = type(hb)()
    # A full filesystem without LMCache's counters: the fault acted, no store is known to have met it.
    b2.fault("f", "disk_full", 1, 5, {"bit": True, "source": "filesystem (no lmcache_http)", "enospc": True},
             params=PARAMS["disk_full"])
    r, row = _row(b2)
    assert r.verdict == "unknown" and row["acted"] is True
    assert "its evidence has no failed_store_chunks" in r.summary


@pytest.mark.parametrize("mode", ["delete", "truncate", "bitflip"])
def test_l2_corrupt_default_needs_a_read_even_with_must_be_read_false(hb, mode):
    params = {"mode": mode, "duration": 4}
    hb.fault("f", "l2_corrupt", 1, 5, {"bit": True, "corrupted": 4, "read": True}, params=params)
    assert _row(hb)[0].verdict == "passed"
    b2 = type(hb)()
    b2.fault("f", "l2_corrupt", 1, 5, {"bit": True, "corrupted": 4, "read": False, "must_be_read": False},
             params={**params, "must_be_read": False})
    r, row = _row(b2)
    assert r.verdict == "unknown" and "trigger (default for l2_corrupt) not reached" in r.summary


def test_the_runner_s_record_of_the_default_is_used(hb):
    """What the runner recorded at apply decides, not what the kind's default would be now."""
    hb.fault("f", "latency", 1, 5, {"bit": True}, params=PARAMS["latency"])
    hb.ops[0]["value"]["default_trigger"] = {"kind": "latency", "basis": "evidence", "text": "recorded"}
    r, row = _row(hb)
    assert r.verdict == "passed" and row["default_trigger"]["text"] == "recorded"


def test_a_declared_trigger_replaces_the_default(hb):
    hb.fault("f", "latency", 1, 5, {"bit": True}, params=PARAMS["latency"],
             trigger={"reached": True, "conditions": []})
    r, row = _row(hb)
    assert r.verdict == "passed" and row["default_trigger"] is None and row["trigger_reached"] is True


def test_trigger_none_passes_with_the_window_unproven(hb):
    hb.fault("f", "latency", 1, 5, {"bit": True},
             params={**PARAMS["latency"], "trigger": "none", "reason": "only heartbeats use this link"})
    r, row = _row(hb)
    assert r.verdict == "passed"
    assert r.details["unproven"] == ["latency f (phase stall): trigger: none (only heartbeats use this link)"]
    assert "windows not proven: 1" in r.summary
    assert row["trigger_reached"] is None and row["default_trigger"] is None


def test_phase_trigger_none_is_unproven(hb):
    hb.op("nemesis", "ok", "trigger", 3.0, "p", value={"scope": "phase", "none": True, "reason": "r"})
    r = evidence.check(hb.ops, Snapshots(), {})
    assert r.verdict == "passed" and r.details["unproven"] == ["phase p: trigger: none (r)"]


def test_an_unknown_kind_without_trigger_is_unproven_never_plain_passed(hb):
    hb.fault("f", "no-such-kind", 1, 5, {"bit": True}, params={})
    r, _ = _row(hb)
    assert r.details["unproven"] and "no default known" in r.details["unproven"][0]
