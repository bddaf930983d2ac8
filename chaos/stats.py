"""Run statistics with the metric definitions a serving team uses.

Every request is classed (cold_miss, local_hit, lmcache_hit_full, lmcache_hit_partial,
lookup_timeout, load_failure_recompute, failed, aborted) and counted per class. Definitions,
also written into every report (`RunStats.definitions`):

- token hit rate (LMCache) = sum(external cache hit tokens) / sum(prompt tokens looked up in
  LMCache); the engine's own prefix cache has its own local token hit rate and is never added
  in (chaos/checks/hits.py has every hit definition).
- request hit rate: any-hit (>= 1 token from LMCache) and full-hit (all but the last prompt
  token served, with >= 1 from LMCache), each over completed requests looked up.
- correct-hit rate = LMCache-hit requests whose output equals recompute / those with a recompute
  expectation (from the recompute_equivalence check); shown next to the hit rate.
- TTFT: time from sending the request to the first output token, as the client measured it
  (streamed requests; for a non-streamed request the engine's TTFT is not visible and it is
  left out). Percentiles by nearest rank: pXX = the ceil(XX/100 * n)-th smallest value.
- ITL: gap between consecutive output tokens of a streamed request; p50 over all gaps pooled.
- goodput = completed requests whose latency is within the request deadline, per second of
  workload time (first invoke to last completion).
"""

from __future__ import annotations

from typing import Any, Iterable

from pydantic import BaseModel, Field

from chaos.checks.hits import DEFINITIONS as HIT_DEFINITIONS
from chaos.checks.percentile import percentile
from chaos.checks.hits import HitSummary, request_hits, summarize
from chaos.checks.requests import RequestRecord, requests
from chaos.history import Op
from chaos.workload.classify import REQUEST_CLASSES


DEFINITIONS: dict[str, str] = {
    **{k: HIT_DEFINITIONS[k] for k in ("token_hit_rate", "local_token_hit_rate", "request_hit_rate",
                                       "full_hit_rate", "correct_hit_rate")},
    "ttft": "client-measured time to first token (streamed requests only); nearest-rank percentiles",
    "itl": "gap between consecutive tokens of streamed requests, all gaps pooled; nearest-rank p50",
    "goodput": "completed requests with latency <= request deadline / workload seconds "
               "(first invoke to last completion)",
}


class ClassStats(BaseModel):
    """Per request class: count and latencies (s); TTFT from streamed requests only."""

    count: int = 0
    ttft_samples: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None


class PhaseHitStats(BaseModel):
    """Hit rates of completed requests (a phase's, or the whole run's in RunStats); rates in 0..1."""

    completed: int = 0
    token_hit_rate: float | None = None
    local_token_hit_rate: float | None = None
    request_hit_rate: float | None = None
    full_hit_rate: float | None = None
    correct_hit_rate: float | None = None
    hits_checked: int = 0
    correct_hits: int = 0


class RunStats(PhaseHitStats):
    """Statistics of one run (all times in s, rates in 0..1, goodput in requests/s)."""

    requests: int = 0
    failed: int = 0
    aborted: int = 0
    in_flight: int = 0
    by_class: dict[str, ClassStats] = Field(default_factory=dict)
    prompt_tokens: int = 0
    looked_up_tokens: int = 0
    local_hit_tokens: int = 0
    external_hit_tokens: int = 0
    by_phase: dict[str, PhaseHitStats] = Field(default_factory=dict)
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
    return ClassStats(count=len(rs), ttft_samples=len(ttft), ttft_p50_s=percentile(ttft, 50),
                      ttft_p99_s=percentile(ttft, 99), latency_p50_s=percentile(lat, 50),
                      latency_p99_s=percentile(lat, 99))


def _phase_hits(s: HitSummary) -> PhaseHitStats:
    return PhaseHitStats.model_validate({k: getattr(s, k) for k in PhaseHitStats.model_fields})


def output_matches_from_checks(checks: Iterable[Any], history: Iterable[Op | dict[str, Any]]) -> dict[str, bool] | None:
    """request id -> output equals recompute, from the run's recompute_equivalence result.

    Args:
        checks: CheckResults (or their dicts) of the run.
        history: the run's ops (the completed requests the check compared).
    Returns:
        None when recompute_equivalence did not run (or crashed); else every completed request
        it compared: False for those in its ``mismatches``, True for the others. Requests in its
        ``no_expectation`` are left out.
    """
    for c in checks:
        d = c if isinstance(c, dict) else c.model_dump()
        if d.get("name") != "recompute_equivalence":
            continue
        details = d.get("details") or {}
        if "mismatches" not in details:
            return None
        bad = {m.get("request_id") for m in details.get("mismatches") or []}
        missing = set(details.get("no_expectation") or [])
        return {r.request_id: r.request_id not in bad for r in requests(history)
                if r.outcome == "ok" and r.request_id not in missing}
    return None


def compute_stats(history: Iterable[Op | dict[str, Any]], deadline_s: float | None = 60.0, *,
                  chunk_size: int = 256, matches: dict[str, bool] | None = None) -> RunStats:
    """Compute RunStats from a history.

    Args:
        history: the run's ops (dicts or `Op` models).
        deadline_s: request deadline (s) for goodput (the liveness check's request_deadline_s);
            None counts every completed request as good.
        chunk_size: LMCache chunk size in tokens (for the stored-prefix definitions).
        matches: request id -> output equals recompute (:func:`output_matches_from_checks`);
            None: the correct-hit rate is not measured.
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
    hits = request_hits(reqs, chunk_size=chunk_size, matches=matches)
    total = summarize(hits)
    st.prompt_tokens, st.looked_up_tokens = total.prompt_tokens, total.looked_up_tokens
    st.local_hit_tokens, st.external_hit_tokens = total.local_tokens, total.lmcache_tokens
    for k in PhaseHitStats.model_fields:
        if k != "completed":  # RunStats counts completed requests itself (the same number)
            setattr(st, k, getattr(total, k))
    for phase in dict.fromkeys(h.phase for h in hits):
        st.by_phase[phase] = _phase_hits(summarize(h for h in hits if h.phase == phase))
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
