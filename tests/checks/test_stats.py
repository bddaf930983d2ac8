import pytest

from chaos.checks.result import CheckResult
from chaos.stats import DEFINITIONS, compute_stats, output_matches_from_checks, percentile

P = list(range(100))


def test_token_and_request_hit_rate_definitions(hb):
    hb.request("w-1", P, [1], t0=0, t1=1)                                  # cold: 0/100
    hb.request("w-2", P, [1], t0=1, t1=2, external=50)                     # 50/100
    hb.request("w-3", P, [1], t0=2, t1=3, local=30, external=20)           # 50/100
    hb.request("w-4", P, outcome="fail", error="HTTP 500", t0=3, t1=4)     # not completed: excluded
    st = compute_stats(hb.ops)
    assert st.completed == 3 and st.failed == 1 and st.requests == 4
    assert st.prompt_tokens == 300
    # LMCache tokens only: the engine's own prefix cache is never added in
    assert st.token_hit_rate == pytest.approx(70 / 300)
    assert st.local_token_hit_rate == pytest.approx(30 / 300)
    assert st.request_hit_rate == pytest.approx(2 / 3)   # any-hit from LMCache
    assert st.full_hit_rate == 0.0
    assert (st.local_hit_tokens, st.external_hit_tokens) == (30, 70)
    assert st.correct_hit_rate is None                  # no recompute expectations: not measured
    assert set(DEFINITIONS) <= set(st.definitions)
    assert "never added in" in st.definitions["token_hit_rate"]


def test_full_hits_correct_hits_and_phases(hb):
    hb.request("w-1", P, [1], phase="warm")                                 # cold
    hb.request("r-1", P, [1], external=99, phase="recover", t0=2, t1=3)    # full hit, right
    hb.request("r-2", P, [2], external=64, phase="recover", t0=2, t1=3)    # partial hit, wrong
    hb.request("r-3", P, [1], local=64, lookup="disabled", phase="recover", t0=2, t1=3)  # no lookup
    checks = [CheckResult(name="recompute_equivalence", verdict="failed", summary="",
                          details={"mismatches": [{"request_id": "r-2"}], "no_expectation": ["r-3"]})]
    matches = output_matches_from_checks(checks, hb.ops)
    assert matches == {"w-1": True, "r-1": True, "r-2": False}
    st = compute_stats(hb.ops, matches=matches)
    assert st.full_hit_rate == pytest.approx(1 / 3)      # looked-up requests: w-1, r-1, r-2
    assert st.request_hit_rate == pytest.approx(2 / 3)
    assert (st.hits_checked, st.correct_hits, st.correct_hit_rate) == (2, 1, 0.5)
    rec = st.by_phase["recover"]
    assert rec.completed == 3 and rec.request_hit_rate == 1.0 and rec.correct_hit_rate == 0.5
    assert st.by_phase["warm"].request_hit_rate == 0.0
    assert output_matches_from_checks([], hb.ops) is None


def test_classes_counted(hb):
    hb.request("w-1", P, [1])
    hb.request("w-2", P, [1], external=99)
    hb.request("w-3", P, [1], external=64)
    hb.request("w-4", P, [1], local=64)
    hb.request("w-5", P, [1], lookup="timeout")
    hb.request("w-6", P, [1], load_failed=64)
    hb.request("w-7", P, outcome="info", aborted=True)
    hb.request("w-8", P, outcome="info", error="deadline exceeded")
    st = compute_stats(hb.ops)
    assert {c: s.count for c, s in st.by_class.items()} == {
        "cold_miss": 1, "local_hit": 1, "lmcache_hit_full": 1, "lmcache_hit_partial": 1,
        "lookup_timeout": 1, "load_failure_recompute": 1, "failed": 1, "aborted": 1}
    assert list(st.by_class)[:2] == ["cold_miss", "local_hit"]


def test_ttft_itl_and_goodput(hb):
    for i in range(10):
        hb.request(f"w-{i}", P, [1, 2], t0=i, t1=i + 1 + (50 if i == 9 else 0),
                   ttft=0.1 * (i + 1), itl=[0.01, 0.03])
    st = compute_stats(hb.ops, deadline_s=30)
    assert st.ttft_p50_s == pytest.approx(0.5)
    assert st.ttft_p99_s == pytest.approx(1.0)
    assert st.itl_p50_s == pytest.approx(0.01)
    assert st.workload_s == pytest.approx(60)
    assert st.goodput_rps == pytest.approx(9 / 60)   # w-9 took 51 s > 30 s deadline
    assert st.by_class["cold_miss"].ttft_p50_s == pytest.approx(0.5)


def test_no_requests_gives_no_rates():
    st = compute_stats([])
    assert st.token_hit_rate is None and st.request_hit_rate is None and st.goodput_rps is None


def test_percentile_nearest_rank():
    xs = list(range(1, 101))
    assert percentile(xs, 50) == 50 and percentile(xs, 99) == 99 and percentile(xs, 100) == 100
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) is None
    assert percentile([5, 1], 0) == 1
    with pytest.raises(ValueError):
        percentile([1], 101)
