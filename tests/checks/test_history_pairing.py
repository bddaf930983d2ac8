"""How the checks read a history: every field of the paired records, on raw ops with the
gaps the history writer can leave (no phase, no kind, no time, inline evidence, out-of-order
ops). Written against the surviving mutants of `make mutation` (docs/mutation.md): each
assertion pins one rule of chaos/checks/requests.py."""

from __future__ import annotations

import pytest

from chaos.checks.requests import FaultRecord, faults, op_dicts, requests


def _op(index, time, process, type_, f, **kw):
    return {"index": index, "time": time, "process": process, "type": type_, "f": f, **kw}


def test_fault_records_every_field():
    ops = [
        # f1: apply invoke then ok; heal invoke then ok with evidence inline (no "evidence" key).
        _op(0, 1.0, "nemesis", "invoke", "apply", fault_id="f1", phase="stall",
            value={"kind": "latency", "link": "engine-lmcache", "latency_ms": 3000}),
        _op(1, 1.5, "nemesis", "ok", "apply", fault_id="f1", phase="stall", value={}),
        _op(2, 4.0, "nemesis", "invoke", "heal", fault_id="f1", phase="stall", value={"kind": "latency"}),
        _op(3, 4.5, "nemesis", "ok", "heal", fault_id="f1", phase="stall",
            value={"kind": "latency", "bit": True, "connections": 2}),
        # f2: no phase, kind only on the heal, apply fails (error), heal fails without error.
        _op(4, 5.0, "nemesis", "invoke", "apply", fault_id="f2", value={"params": {"x": 1}}),
        _op(5, 5.25, "nemesis", "fail", "apply", fault_id="f2", value={"error": "proxy said 500"}),
        _op(6, 6.0, "nemesis", "fail", "heal", fault_id="f2", value={"kind": "pause"}),
        # f3: an apply completion with no invoke and no time; never healed.
        _op(7, None, "nemesis", "info", "apply", fault_id="f3", phase="p", value={"kind": "kill"}),
        # Not faults: a client op with a fault_id, a nemesis op without one.
        _op(8, 7.0, "client-0", "invoke", "apply", fault_id="f9", value={"kind": "x"}),
        _op(9, 7.0, "nemesis", "invoke", "apply", value={"kind": "y"}),
    ]
    got = [f.model_dump() for f in faults(ops)]
    # f3's op has no time: it sorts first (time 0).
    assert got[0] == {"fault_id": "f3", "kind": "kill", "phase": "p", "applied_at": 0.0, "healed_at": None,
                      "apply_outcome": "info", "heal_outcome": None, "params": {}, "evidence": None,
                      "error": None, "trigger": None, "default_trigger": None}
    assert got[1:] == [
        {"fault_id": "f1", "kind": "latency", "phase": "stall", "applied_at": 1.5, "healed_at": 4.5,
         "apply_outcome": "ok", "heal_outcome": "ok",
         "params": {"link": "engine-lmcache", "latency_ms": 3000},
         "evidence": {"bit": True, "connections": 2}, "error": None, "trigger": None, "default_trigger": None},
        {"fault_id": "f2", "kind": "pause", "phase": "", "applied_at": 5.0, "healed_at": 6.0,
         "apply_outcome": "fail", "heal_outcome": "fail", "params": {"x": 1}, "evidence": None,
         "error": "proxy said 500", "trigger": None, "default_trigger": None},
    ]


def test_fault_kind_and_phase_come_from_the_first_op_that_has_them():
    ops = [_op(0, 1.0, "nemesis", "invoke", "apply", fault_id="f", phase="a", value={"kind": "latency"}),
           _op(1, 2.0, "nemesis", "ok", "apply", fault_id="f", phase="b", value={"kind": "pause"})]
    (f,) = faults(ops)
    assert (f.kind, f.phase) == ("latency", "a")


def test_fault_without_kind_or_phase_reads_empty_strings():
    (f,) = faults([_op(0, 2.0, "nemesis", "invoke", "apply", fault_id=7, value={})])
    assert (f.fault_id, f.kind, f.phase, f.applied_at) == ("7", "", "", 2.0)


def test_a_failed_apply_after_an_ok_keeps_the_ok_time_and_a_heal_error_wins():
    ops = [_op(0, 1.0, "nemesis", "invoke", "apply", fault_id="f", value={"kind": "k"}),
           _op(1, 2.0, "nemesis", "ok", "apply", fault_id="f", value={}),
           _op(2, 3.0, "nemesis", "info", "apply", fault_id="f", value={}),
           _op(3, 4.0, "nemesis", "invoke", "heal", fault_id="f", value={"bit": True}),
           _op(4, 5.0, "nemesis", "fail", "heal", fault_id="f", value={"error": "heal broke"})]
    (f,) = faults(ops)
    assert f.applied_at == 2.0  # the info op does not move the ok time
    assert f.apply_outcome == "info"
    assert f.healed_at == 5.0 and f.heal_outcome == "fail"
    assert f.evidence is None  # the heal *invoke* carries no evidence
    assert f.error == "heal broke"


def test_apply_fail_with_no_time_after_an_invoke_keeps_the_invoke_time():
    ops = [_op(0, 3.0, "nemesis", "invoke", "apply", fault_id="f", value={}),
           _op(1, 3.5, "nemesis", "fail", "apply", fault_id="f", value={})]
    (f,) = faults(ops)
    assert f.applied_at == 3.0 and f.error is None


def test_evidence_key_wins_over_inline_keys_and_non_dict_evidence_is_ignored():
    ops = [_op(0, 1.0, "nemesis", "ok", "heal", fault_id="a", value={"evidence": {"bit": False}, "bit": True}),
           _op(1, 1.0, "nemesis", "ok", "heal", fault_id="b", value={"evidence": "yes"})]
    a, b = faults(ops)
    assert a.evidence == {"bit": False} and not a.bit
    assert b.evidence is None and not b.bit


def test_bit_needs_true():
    assert FaultRecord(fault_id="x", evidence={"bit": True}).bit
    assert not FaultRecord(fault_id="x", evidence={"bit": 1}).bit
    assert not FaultRecord(fault_id="x").bit


def test_op_dicts_sort_by_time_then_index_and_fill_value():
    ops = [{"index": 2, "time": 1.0, "value": None}, {"index": 1, "time": 1.0},
           {"index": 0, "time": 2.0}, {"index": 5}, {"time": 0.5, "index": None}]
    got = op_dicts(ops)
    assert [(d.get("time"), d.get("index")) for d in got] == [
        (None, 5), (0.5, None), (1.0, 1), (1.0, 2), (2.0, 0)]
    assert all(d["value"] == {} for d in got)
    assert op_dicts([{"index": 0}, {"index": 1}])[0]["index"] == 0


def test_op_dicts_rejects_other_types_naming_them():
    with pytest.raises(TypeError, match="history op must be a dict or a pydantic model, got int"):
        op_dicts([3])


def _client(index, time, type_, rid, value, **kw):
    return _op(index, time, kw.pop("process", "client-1"), type_, kw.pop("f", "complete"),
               request_id=rid, value=value, **kw)


def test_request_records_every_field():
    ops = [
        _client(0, 1.0, "invoke", "r1", {"prompt_token_ids": [1, 2, 3], "cache_salt": "t-1"}, phase="hit"),
        _client(1, 2.5, "ok", "r1", {
            "token_ids": [7, 8], "finish_reason": "length", "ttft_s": 0.25, "itl_s": [0.5, 1],
            "kv_transfer_params": {"cached_token_stats": {"external_cache_hit_tokens": 2, "lookup": "hit"}},
            "usage": {"prompt_tokens": 3}}, phase="hit"),
        # r2: prompt only on the completion; prompt length from prompt_len; no stats.
        _client(2, 3.0, "invoke", "r2", {"prompt": "text", "tenant": "t-2", "cache_salt": "ignored"}),
        _client(3, 4.0, "fail", "r2", {"error": "boom", "aborted": True, "prompt_token_ids": [1, 2],
                                         "prompt_len": 9}),
        # r3: no completion; r4's second completion is ignored; a completion of no invoke too.
        _client(4, 5.0, "invoke", "r3", {"prompt": [4, 5]}),
        _client(5, 6.0, "invoke", "r4", {}),
        _client(6, 7.0, "info", "r4", {}),
        _client(7, 8.0, "ok", "r4", {"token_ids": [1]}),
        _client(8, 9.0, "ok", "ghost", {"token_ids": [1]}),
        # Not requests: nemesis ops, other f, no request id.
        _op(9, 1.0, "nemesis", "invoke", "complete", request_id="n1", value={}),
        _client(10, 1.0, "invoke", "x1", {}, f="lookup"),
        _op(11, 1.0, "client-1", "invoke", "complete", value={}),
    ]
    recs = requests(ops)
    assert [r.request_id for r in recs] == ["r1", "r2", "r3", "r4"]
    r1, r2, r3, r4 = recs
    assert (r1.process, r1.phase, r1.invoke_time, r1.end_time, r1.outcome) == ("client-1", "hit", 1.0, 2.5, "ok")
    assert (r1.tenant, r1.prompt_token_ids, r1.token_ids, r1.finish_reason) == ("t-1", [1, 2, 3], [7, 8], "length")
    assert r1.cached_token_stats.model_dump() == {
        "local_cache_hit_tokens": 0, "external_cache_hit_tokens": 2, "lookup": "hit",
        "load_failed_tokens": 0, "num_preemptions": 0}
    assert (r1.prompt_tokens, r1.ttft_s, r1.itl_s, r1.error, r1.aborted) == (3, 0.25, [0.5, 1.0], None, False)
    # Stats under kv_transfer_params classify too (2 of 3 tokens = a full hit: the last is computed).
    assert r1.request_class == "lmcache_hit_full" and r1.hit_tokens == 2 and r1.latency_s == 1.5
    assert r1.invoke_value == {"prompt_token_ids": [1, 2, 3], "cache_salt": "t-1"}
    assert r1.end_value["finish_reason"] == "length"
    assert (r2.tenant, r2.prompt_token_ids, r2.prompt_tokens, r2.cached_token_stats) == ("t-2", [1, 2], 9, None)
    assert (r2.outcome, r2.error, r2.aborted, r2.phase, r2.hit_tokens) == ("fail", "boom", True, "", 0)
    assert r2.request_class == "aborted"
    assert (r3.prompt_token_ids, r3.outcome, r3.end_time, r3.latency_s, r3.request_class) == (
        [4, 5], None, None, None, None)
    assert (r4.outcome, r4.token_ids, r4.end_time) == ("info", None, 7.0)


def test_prompt_tokens_fall_back_to_prompt_len_then_prompt_ids():
    ops = [_client(0, 0.0, "invoke", "a", {"prompt_token_ids": [1, 2, 3, 4]}),
           _client(1, 1.0, "ok", "a", {"token_ids": [], "prompt_len": 6}),
           _client(2, 0.0, "invoke", "b", {"prompt_token_ids": [1, 2, 3, 4]}),
           _client(3, 1.0, "ok", "b", {"token_ids": []}),
           _client(4, 0.0, "invoke", "c", {}),
           _client(5, 1.0, "ok", "c", {"token_ids": []})]
    assert [r.prompt_tokens for r in requests(ops)] == [6, 4, None]


def test_cached_token_stats_directly_or_under_kv_transfer_params():
    ops = [_client(0, 0.0, "invoke", "a", {}),
           _client(1, 1.0, "ok", "a", {"cached_token_stats": {"local_cache_hit_tokens": 5}}),
           _client(2, 0.0, "invoke", "b", {}),
           _client(3, 1.0, "ok", "b", {"kv_transfer_params": {"cached_token_stats": {"local_cache_hit_tokens": 6}}}),
           _client(4, 0.0, "invoke", "c", {}),
           _client(5, 1.0, "ok", "c", {"kv_transfer_params": None, "cached_token_stats": None})]
    assert [r.cached_token_stats and r.cached_token_stats.local_cache_hit_tokens for r in requests(ops)] == [5, 6, None]


def test_tenant_prefers_tenant_then_cache_salt():
    ops = [_client(0, 0.0, "invoke", "a", {"tenant": "x", "cache_salt": "y"}),
           _client(1, 0.0, "invoke", "b", {"tenant": None, "cache_salt": "y"}),
           _client(2, 0.0, "invoke", "c", {"cache_salt": 3}),
           _client(3, 0.0, "invoke", "d", {})]
    assert [r.tenant for r in requests(ops)] == ["x", "y", "3", None]


def test_classification_uses_the_prompt_length_for_full_vs_partial_hits():
    # 4 of a 5-token prompt from LMCache, prompt length known only from the invoke: full hit
    # (only the last token computed); with prompt_len 9 on the completion: partial.
    full = [_client(0, 0.0, "invoke", "a", {"prompt_token_ids": [1, 2, 3, 4, 5]}),
            _client(1, 1.0, "ok", "a", {"token_ids": [1], "cached_token_stats": {"external_cache_hit_tokens": 4}})]
    partial = [_client(0, 0.0, "invoke", "a", {"prompt_token_ids": [1, 2, 3, 4, 5]}),
               _client(1, 1.0, "ok", "a", {"token_ids": [1], "prompt_len": 9,
                                           "cached_token_stats": {"external_cache_hit_tokens": 4}})]
    assert requests(full)[0].request_class == "lmcache_hit_full"
    assert requests(partial)[0].request_class == "lmcache_hit_partial"


def test_requests_gaps_default_f_process_time_and_usage_first():
    ops = [
        _op(0, None, "client-0", "ok", "complete", request_id="ghost", value={"token_ids": [1]}),
        {"index": 1, "time": None, "type": "invoke", "request_id": "a", "value": {"prompt_token_ids": [1, 2]}},
        {"index": 2, "time": None, "type": "ok", "request_id": "a",
         "value": {"token_ids": [3], "usage": {"prompt_tokens": 3}, "prompt_len": 9}},
    ]
    (a,) = requests(ops)  # no "f" means a completion request; the ghost does not stop the pairing
    assert (a.process, a.end_time, a.prompt_tokens, a.outcome) == ("", 0.0, 3, "ok")


def test_classification_falls_back_to_the_paired_prompt_length():
    # No prompt_len on the completion: the 9 prompt ids of the invoke make 4 hit tokens partial.
    ops = [_client(0, 0.0, "invoke", "a", {"prompt_token_ids": list(range(9))}),
           _client(1, 1.0, "ok", "a", {"token_ids": [1], "cached_token_stats": {"external_cache_hit_tokens": 4}})]
    assert requests(ops)[0].request_class == "lmcache_hit_partial"


def test_fault_times_default_to_zero_and_same_time_keeps_file_order():
    ops = [_op(0, None, "nemesis", "invoke", "apply", fault_id="f", value={}),
           _op(1, None, "nemesis", "ok", "heal", fault_id="f", value={"bit": True})]
    (f,) = faults(ops)
    assert (f.applied_at, f.healed_at) == (0.0, 0.0)
    got = op_dicts([{"time": 1.0, "name": "no-index"}, {"time": 1.0, "index": 0, "name": "index-0"}])
    assert [d["name"] for d in got] == ["no-index", "index-0"]


def test_ops_at_the_same_time_sort_by_index_from_zero():
    got = op_dicts([{"time": 1.0, "index": 1, "name": "b"}, {"time": 1.0, "index": 0, "name": "a"}])
    assert [d["name"] for d in got] == ["a", "b"]


def test_classification_uses_the_completions_prompt_len_over_usage():
    # prompt_len 9 (partial for a 4-token hit) wins over usage's 5 (which would read as full).
    ops = [_client(0, 0.0, "invoke", "a", {}),
           _client(1, 1.0, "ok", "a", {"token_ids": [1], "prompt_len": 9, "usage": {"prompt_tokens": 5},
                                       "cached_token_stats": {"external_cache_hit_tokens": 4}})]
    (a,) = requests(ops)
    assert a.prompt_tokens == 5 and a.request_class == "lmcache_hit_partial"
