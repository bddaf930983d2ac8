"""Run statistics with the metric definitions a serving team uses.

Every request is classed (cold_miss, local_hit, lmcache_hit_full, lmcache_hit_partial,
lookup_timeout, load_failure_recompute, failed, aborted) and counted per class. Definitions,
also written into every report (`RunStats.definitions`):

- token hit rate = sum(local + external cache hit tokens) / sum(prompt tokens), over completed
  requests. How much prefill the cache saved.
- request hit rate = completed requests with any hit token (local or external) / completed
  requests. How often the cache helped at all.
- TTFT: time from sending the request to the first output token, as the client measured it
  (streamed requests; for a non-streamed request the engine's TTFT is not visible and it is
  left out). Percentiles by nearest rank: pXX = the ceil(XX/100 * n)-th smallest value.
- ITL: gap between consecutive output tokens of a streamed request; p50 over all gaps pooled.
- goodput = completed requests whose latency is within the request deadline, per second of
  workload time (first invoke to last completion).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from pydantic import BaseModel, Field

from chaos.checks.requests import RequestRecord, requests
from chaos.history import Op
from chaos.workload.classify import REQUEST_CLASSES


DEFINITIONS: dict[str, str] = {
    "token_hit_rate": "sum(local + external cache hit tokens) / sum(prompt tokens), completed requests",
    "request_hit_rate": "completed requests with any local or external hit token / completed requests",
    "ttft": "client-measured time to first token (streamed requests only); nearest-rank percentiles",
    "itl": "gap between consecutive tokens of streamed requests, all gaps pooled; nearest-rank p50",
    "goodput": "completed requests with latency <= request deadline / workload seconds "
               "(first invoke to last completion)",
}


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile.

    Args:
        values: samples (any order).
        q: percentile in [0, 100].
    Returns:
        the ceil(q/100 * n)-th smallest value (the smallest for q=0); None for no samples.
    Raises:
        ValueError: q outside [0, 100].
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within [0, 100], got {q}")
    xs = sorted(values)
    if not xs:
        return None
    rank = max(1, math.ceil(q / 100 * len(xs)))
    return xs[rank - 1]


class ClassStats(BaseModel):
    """Per request class: count and latencies (s)."""

    count: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    latency_p50_s: float | None = None


class RunStats(BaseModel):
    """Statistics of one run (all times in s, rates in 0..1, goodput in requests/s)."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    in_flight: int = 0
    by_class: dict[str, ClassStats] = Field(default_factory=dict)
    prompt_tokens: int = 0
    local_hit_tokens: int = 0
    external_hit_tokens: int = 0
    token_hit_rate: float | None = None
    request_hit_rate: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    goodput_rps: float | None = None
    deadline_s: float | None = None
    workload_s: float | None = None
    definitions: dict[str, str] = Field(default_factory=lambda: dict(DEFINITIONS))


def _class_stats(rs: list[RequestRecord]) -> ClassStats:
    ttft = [r.ttft_s for r in rs if r.ttft_s is not None]
    lat = [r.latency_s for r in rs if r.latency_s is not None]
    return ClassStats(count=len(rs), ttft_p50_s=percentile(ttft, 50), ttft_p99_s=percentile(ttft, 99),
                      latency_p50_s=percentile(lat, 50))


def compute_stats(history: Iterable[Op | dict[str, Any]], deadline_s: float | None = 60.0) -> RunStats:
    """Compute RunStats from a history.

    Args:
        history: the run's ops (dicts or `Op` models).
        deadline_s: request deadline (s) for goodput (the liveness check's request_deadline_s);
            None counts every completed request as good.
    Returns:
        RunStats; rates are None when there is nothing to divide by.
    """
    reqs = requests(history)
    done = [r for r in reqs if r.outcome == "ok"]
    st = RunStats(requests=len(reqs), completed=len(done), deadline_s=deadline_s,
                  failed=sum(r.request_class == "failed" for r in reqs),
                  aborted=sum(r.request_class == "aborted" for r in reqs),
                  in_flight=sum(r.outcome is None for r in reqs))
    groups: dict[str, list[RequestRecord]] = {}
    for r in reqs:
        if r.request_class is not None:
            groups.setdefault(r.request_class, []).append(r)
    order = list(REQUEST_CLASSES) + sorted(set(groups) - set(REQUEST_CLASSES))
    st.by_class = {c: _class_stats(groups[c]) for c in order if c in groups}
    for r in done:
        st.prompt_tokens += r.prompt_tokens or 0
        if r.cached_token_stats:
            st.local_hit_tokens += r.cached_token_stats.local_cache_hit_tokens
            st.external_hit_tokens += r.cached_token_stats.external_cache_hit_tokens
    if st.prompt_tokens:
        st.token_hit_rate = (st.local_hit_tokens + st.external_hit_tokens) / st.prompt_tokens
    if done:
        st.request_hit_rate = sum(r.hit_tokens > 0 for r in done) / len(done)
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    st.ttft_p50_s, st.ttft_p99_s = percentile(ttft, 50), percentile(ttft, 99)
    st.itl_p50_s = percentile([g for r in done for g in r.itl_s], 50)
    if reqs:
        ends = [r.end_time for r in reqs if r.end_time is not None]
        start = min(r.invoke_time for r in reqs)
        st.workload_s = (max(ends) - start) if ends else None
        if st.workload_s:
            good = [r for r in done if deadline_s is None or (r.latency_s or 0) <= deadline_s]
            st.goodput_rps = len(good) / st.workload_s
    return st
