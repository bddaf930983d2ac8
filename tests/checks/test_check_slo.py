"""slo: TTFT and latency percentiles per request class, the lookup-timeout rate, and hit TTFT
against cold TTFT at the same prompt length; unknown with too few samples (and TTFT only from
streamed requests)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from chaos.checks.config import SloConfig
from chaos.checks.slo import check
from chaos.checks.snapshots import Snapshots

P = list(range(544))  # 512-token prefix + 32


def cold_and_hits(hb, cold_ttft, hit_ttft, *, n=5, stream=True, fault_during_cold=False):
    for i in range(n):
        hb.request(f"w-{i}", P[:-1] + [1000 + i], [1] * 4, t0=i, t1=i + 0.9, phase="warm",
                   ttft=cold_ttft if stream else None)
    if fault_during_cold:
        hb.fault("latency-0", "latency", 0.0, n + 1.0, {"bit": True}, phase="warm")
    for i in range(n):
        hb.request(f"r-{i}", P[:-1] + [2000 + i], [1] * 4, t0=20 + i, t1=20.9 + i, external=512,
                   phase="recover", ttft=hit_ttft if stream else None)


def test_hits_faster_than_cold_pass(hb):
    cold_and_hits(hb, 0.6, 0.15)
    r = check(hb.ops, Snapshots(), SloConfig(hit_speedup={"min_ratio": 1.5}))
    assert r.verdict == "passed", r.summary
    (row,) = r.details["hit_speedup"]["lengths"]
    assert row["prompt_tokens"] == 544 and row["ratio"] == pytest.approx(4.0)


def test_a_hit_with_no_speedup_fails(hb):
    """The triage's false hit: a high hit rate with TTFT unchanged."""
    cold_and_hits(hb, 0.6, 0.62)
    r = check(hb.ops, Snapshots(), SloConfig(hit_speedup={}))
    assert r.verdict == "failed"
    assert r.summary.startswith("hit brings no speedup at 544 prompt tokens: median hit TTFT 0.620s vs cold 0.600s")


def test_hit_speedup_with_too_few_samples_is_unknown(hb):
    cold_and_hits(hb, 0.6, 0.62, n=2)
    r = check(hb.ops, Snapshots(), SloConfig(hit_speedup={}))
    assert r.verdict == "unknown" and "too few samples" in r.summary


def test_cold_requests_under_a_fault_are_no_baseline(hb):
    """A stalled lookup makes cold look slow: it must not vouch for a speedup."""
    cold_and_hits(hb, 3.0, 0.62, fault_during_cold=True)
    r = check(hb.ops, Snapshots(), SloConfig(hit_speedup={}))
    assert r.verdict == "unknown" and r.details["hit_speedup"]["cold_overlapping_faults"] == 5


def test_different_prompt_lengths_are_not_compared(hb):
    for i in range(5):
        hb.request(f"w-{i}", list(range(300)) + [i], [1], t0=i, t1=i + 1, ttft=0.3, phase="warm")
        hb.request(f"r-{i}", P[:-1] + [i], [1], t0=20 + i, t1=21 + i, ttft=0.5, external=512, phase="recover")
    r = check(hb.ops, Snapshots(), SloConfig(hit_speedup={}))
    assert r.verdict == "unknown"  # 0.5 s > 0.3 s, but the cold prompts were shorter


def test_ttft_needs_streamed_requests(hb):
    cold_and_hits(hb, 0.6, 0.15, stream=False)
    r = check(hb.ops, Snapshots(), SloConfig(ttft={"lmcache_hit_partial": {"p99": 1.0}}))
    assert r.verdict == "unknown"
    assert "TTFT needs streamed requests" in r.summary


def test_percentile_bounds_per_class(hb):
    cold_and_hits(hb, 0.6, 0.15)
    ok = SloConfig(ttft={"cold_miss": {"p50": 1.0, "p99": "1s"}, "lmcache_hit_partial": {"max": "200ms"}},
                   latency={"any": {"p99": 1.0}})
    r = check(hb.ops, Snapshots(), ok)
    assert r.verdict == "passed", r.summary
    assert r.details["ttft"]["cold_miss"]["p50"] == {"value_s": 0.6, "bound_s": 1.0, "verdict": "passed"}
    bad = SloConfig(ttft={"lmcache_hit_partial": {"p99": "100ms"}}, phases=["recover"])
    r = check(hb.ops, Snapshots(), bad)
    assert r.verdict == "failed" and r.summary == "ttft p99 of lmcache_hit_partial is 0.150s > 0.1s (5 samples)"
    few = SloConfig(latency={"lookup_timeout": {"p99": 1.0}})
    assert check(hb.ops, Snapshots(), few).verdict == "unknown"


def test_lookup_timeout_rate(hb):
    for i in range(10):
        hb.request(f"s-{i}", P, [1], t0=i, t1=i + 1, lookup="timeout" if i < 3 else "miss", phase="stall")
    assert check(hb.ops, Snapshots(), SloConfig(max_lookup_timeout_rate=0.3)).verdict == "passed"
    r = check(hb.ops, Snapshots(), SloConfig(max_lookup_timeout_rate=0.2))
    assert r.verdict == "failed" and r.summary == "3 of 10 requests had their lookup time out (30% > 20%)"
    r = check(hb.ops, Snapshots(), SloConfig(max_lookup_timeout_rate=0.2, min_samples=20))
    assert r.verdict == "unknown"


def test_config_errors():
    with pytest.raises(ValidationError, match="at least one bound"):
        SloConfig()
    with pytest.raises(ValidationError, match="unknown request class"):
        SloConfig(ttft={"lmcache_hit": {"p99": 1}})
    with pytest.raises(ValidationError):
        SloConfig(ttft={"any": {"p95": 1}})
