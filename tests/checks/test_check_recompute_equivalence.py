from chaos.checks import Snapshots, recompute_equivalence
from chaos.checks.recompute_equivalence import first_difference

PROMPT = list(range(600))


def test_all_equal_passes(hb):
    hb.request("w-1", PROMPT, [5, 6, 7])
    hb.request("w-2", PROMPT, [5, 6, 7], external=512, t0=1, t1=2)
    r = recompute_equivalence.check(hb.ops, Snapshots(expected={"w-1": [5, 6, 7], "w-2": [5, 6, 7]}), {})
    assert r.verdict == "passed", r.summary
    assert r.details["checked"] == 2


def test_planted_wrong_token_fails_with_position_class_and_stats(hb):
    hb.request("w-1", PROMPT, [104, 6, 7])
    hb.request("w-17", PROMPT, [7, 6, 7], external=512, t0=1, t1=2)
    r = recompute_equivalence.check(hb.ops, Snapshots(expected={"w-1": [104, 6, 7], "w-17": [104, 6, 7]}), None)
    assert r.verdict == "failed"
    assert r.summary == ("req w-17 (lmcache_hit_partial, 512 tokens from LMCache): token 0 differs: "
                         "expected 104, got 7")
    (m,) = r.details["mismatches"]
    assert m["request_id"] == "w-17" and m["position"] == 0
    assert m["expected_window"] == [104, 6, 7] and m["actual_window"] == [7, 6, 7]
    assert m["cached_token_stats"]["external_cache_hit_tokens"] == 512
    assert m["request_class"] == "lmcache_hit_partial"


def test_window_is_short_and_centered_on_first_difference(hb):
    exp = list(range(100, 140))
    got = exp[:20] + [1] + exp[21:]
    hb.request("w-3", PROMPT, got, external=599)
    r = recompute_equivalence.check(hb.ops, Snapshots(expected={"w-3": exp}), {})
    m = r.details["mismatches"][0]
    assert m["position"] == 20 and m["window_start"] == 16
    assert m["expected_window"] == exp[16:25] and m["actual_window"][4] == 1
    assert "lmcache_hit_full" in r.summary and "token 20 differs: expected 120, got 1" in r.summary


def test_shorter_output_is_a_difference_but_abort_prefix_is_not(hb):
    hb.request("w-4", PROMPT, [1, 2], finish="length")
    hb.request("w-5", PROMPT, [1, 2], finish="abort", t0=1, t1=2)
    r = recompute_equivalence.check(hb.ops, Snapshots(expected={"w-4": [1, 2, 3], "w-5": [1, 2, 3]}), {})
    assert r.verdict == "failed"
    assert [m["request_id"] for m in r.details["mismatches"]] == ["w-4"]
    assert "output length differs: expected 3 tokens, got 2" in r.summary


def test_no_completed_request_is_unknown(hb):
    hb.request("w-1", PROMPT, outcome="fail", error="HTTP 500")
    r = recompute_equivalence.check(hb.ops, Snapshots(expected={"w-1": [1]}), {})
    assert r.verdict == "unknown" and "no request completed" in r.summary


def test_missing_expectation_is_unknown_not_passed(hb):
    hb.request("w-1", PROMPT, [1])
    hb.request("w-2", PROMPT, [1], t0=1, t1=2)
    r = recompute_equivalence.check(hb.ops, Snapshots(expected={"w-1": [1]}), {})
    assert r.verdict == "unknown"
    assert r.details["no_expectation"] == ["w-2"]


def test_mismatch_beats_missing_expectation(hb):
    hb.request("w-1", PROMPT, [2])
    hb.request("w-2", PROMPT, [1], t0=1, t1=2)
    r = recompute_equivalence.check(hb.ops, Snapshots(expected={"w-1": [1]}), {})
    assert r.verdict == "failed"


def test_first_difference():
    assert first_difference([1, 2], [1, 2]) is None
    assert first_difference([1, 2], [1, 3]) == 1
    assert first_difference([1, 2], [1]) == 1
    assert first_difference([], [4]) == 0


def test_mismatch_detail_every_field(hb):
    from chaos.checks.recompute_equivalence import mismatch_detail
    from chaos.checks.requests import requests

    hb.request("w-9", list(range(300)), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], external=256, local=16,
               tenant="t-1", phase="hit", load_failed=0, preemptions=2, finish="stop")
    (rec,) = requests(hb.ops)
    expected = [1, 2, 3, 4, 5, 6, 0, 8, 9, 10, 11, 12]
    d = mismatch_detail(rec, expected, 6)
    assert d == {
        "request_id": "w-9", "phase": "hit", "tenant": "t-1", "request_class": "lmcache_hit_partial",
        "cached_token_stats": {"local_cache_hit_tokens": 16, "external_cache_hit_tokens": 256, "lookup": "hit",
                               "load_failed_tokens": 0, "num_preemptions": 2},
        "prompt_tokens": 300, "position": 6, "window_start": 2,
        "expected_window": [3, 4, 5, 6, 0, 8, 9, 10, 11], "actual_window": [3, 4, 5, 6, 7, 8, 9, 10, 11],
        "expected_len": 12, "actual_len": 12, "finish_reason": "stop",
        "line": ("req w-9 (lmcache_hit_partial, 256 tokens from LMCache, 16 tokens from local prefix cache, "
                 "preempted 2x): token 6 differs: expected 0, got 7")}


def test_mismatch_line_for_lengths_and_unclassified(hb):
    from chaos.checks.recompute_equivalence import mismatch_detail, mismatch_line
    from chaos.checks.requests import RequestRecord, requests

    hb.request("w-1", [1, 2], [5, 6, 7], load_failed=256)
    (rec,) = requests(hb.ops)
    # The actual output is longer than expected, equal on the expected part.
    assert mismatch_line(rec, [5, 6], 2) == (
        "req w-1 (load_failure_recompute, 256 tokens failed to load): output length differs: "
        "expected 2 tokens, got 3")
    bare = RequestRecord(request_id="w-2", invoke_time=0.0)
    assert mismatch_line(bare, [1], 0) == "req w-2 (unclassified): output length differs: expected 1 tokens, got 0"
    assert mismatch_detail(bare, [1], 0)["cached_token_stats"] is None
