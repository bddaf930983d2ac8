"""slo: service-level bounds per request class, and hits that must be faster than recompute.

    requests of ``phases`` ──> by class (cold_miss, lmcache_hit_full, lookup_timeout, ..., any)
        ttft:    {class: {p50, p90, p99, max}}   nearest-rank percentiles of TTFT (s)
        latency: {class: {p50, p90, p99, max}}   of end-to-end latency (s)
    max_lookup_timeout_rate                       requests whose lookup timed out / looked up
    hit_speedup                                   median cold TTFT / median hit TTFT, per prompt
                                                  length, >= min_ratio

What is measured (/work/shared/corpus/false-hit-triage.md, "Definitions before claims"):
- TTFT is the client's time from sending the request to the first streamed token event: network
  and engine queueing count. Only streamed requests have one (``workload.stream``); a
  non-streamed request's total time is its latency, never its TTFT.
- latency is sending to the last byte of the answer (any outcome; an aborted request's is when
  the client gave up).
- a lookup timeout is a completed request whose engine reported ``lookup: timeout`` (the engine
  asked LMCache once per scheduling and stopped waiting; it recomputed). The bound is a rate over
  completed requests that were looked up.
- hit speedup: "a hit that brings no speedup is a false hit" (the triage's first reading of a
  high hit rate). Hits (at least ``min_hit_share`` of the prompt from LMCache) are compared with
  cold misses of exactly the same prompt length, since prefill time grows with the tokens
  computed; cold requests that overlapped a fault are never a baseline (a stalled lookup would
  make cold look slow and hide a false hit). Medians, not means, and at least ``min_samples`` on
  both sides, so a loaded machine neither fails a real speedup nor passes a missing one on one
  outlier.

A bound exceeded is judged against the run's own baseline (chaos/checks/host_load.py, the rule
liveness uses): when for every request above the bound the recompute twin was as slow for its
prompt (within 3x, same metric; the only baseline for a request a fault was in place for), or,
with no fault in place and no twin figure, the fault-free peers of its phase were (median at
least half the bound), the host was slow, not the stack: that bound is unknown ("host load",
with the figures), not failed. One request above the bound fast on the twin, or with a fault in
place and no twin figure, keeps the bound failed.

Verdicts: failed when a bound with enough samples is exceeded (a hit speedup below
``min_ratio`` at some prompt length counts); unknown when some bound could not be measured
(fewer than ``min_samples`` samples: no streamed request of a class, no cold baseline of the
same length, ...) and none failed; passed otherwise.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from chaos.checks import host_load
from chaos.checks.config import HitSpeedupConfig, PercentileBounds, SloConfig
from chaos.checks.percentile import percentile
from chaos.checks.registry import coerce_config, register
from chaos.checks.requests import RequestRecord, faults, requests
from chaos.checks.result import CheckResult
from chaos.checks.snapshots import Snapshots
from chaos.history import Op

NAME = "slo"
_Q = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}


def _in_class(rec: RequestRecord, cls: str) -> bool:
    return cls == "any" or rec.request_class == cls


def _samples(metric: str, members: list[RequestRecord]) -> list[float]:
    if metric == "ttft":
        return [r.ttft_s for r in members if r.ttft_s is not None]
    return [r.latency_s for r in members if r.latency_s is not None]


def _over(metric: str, members: list[RequestRecord], bound: float) -> list[RequestRecord]:
    return [r for r in members if (v := host_load.metric_of(r, metric)) is not None and v > bound]  # type: ignore[arg-type]


def exceeded(history: Sequence[Op | dict[str, Any]], config: SloConfig | dict[str, Any]) -> list[tuple[str, float, RequestRecord]]:
    """``(metric, bound_s, request)`` for every request above a TTFT or latency percentile
    bound that its class exceeds with enough samples (the requests the host-load rule judges)."""
    cfg = coerce_config(config, SloConfig)
    recs = [r for r in requests(history) if cfg.phases is None or r.phase in cfg.phases]
    out: list[tuple[str, float, RequestRecord]] = []
    for metric, table in (("ttft", cfg.ttft), ("latency", cfg.latency)):
        for cls, bounds in table.items():
            members = [r for r in recs if r.outcome is not None and _in_class(r, cls)]
            samples = _samples(metric, members)
            for name, bound in bounds.items():
                value = percentile(samples, _Q[name]) if samples else None
                if len(samples) >= cfg.min_samples and value is not None and value > bound:
                    out.extend((metric, bound, r) for r in _over(metric, members, bound))
    return out


def slow_requests(history: Sequence[Op | dict[str, Any]],
                  config: SloConfig | dict[str, Any] | None = None) -> list[RequestRecord]:
    """The requests above an exceeded bound whose judgement reads the twin baseline."""
    if config is None:
        return []
    seen: dict[str, RequestRecord] = {}
    for _, _, r in exceeded(history, config):
        seen.setdefault(r.request_id, r)
    return host_load.wanted(seen.values())


def _bounds(metric: str, table: dict[str, PercentileBounds], recs: list[RequestRecord], min_samples: int,
            problems: list[str], undecided: list[str], everyone: list[RequestRecord],
            windows: list[host_load.FaultWindow], snapshots: Snapshots) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cls, bounds in table.items():
        members = [r for r in recs if r.outcome is not None and _in_class(r, cls)]
        samples = _samples(metric, members)
        row: dict[str, Any] = {"requests": len(members), "samples": len(samples)}
        for name, bound in bounds.items():
            value = percentile(samples, _Q[name]) if samples else None
            row[name] = {"value_s": value, "bound_s": bound}
            if len(samples) < min_samples:
                why = (" (TTFT needs streamed requests: workload.stream)"
                       if metric == "ttft" and members and not samples else "")
                undecided.append(f"{metric} {name} of {cls}: too few samples ({len(samples)} of "
                                 f"{len(members)} requests; {min_samples} needed){why}")
                row[name]["verdict"] = "unknown"
            elif value is not None and value > bound:
                judged = [host_load.judge(r, metric, bound, everyone, windows, snapshots.twin_baseline)  # type: ignore[arg-type]
                          for r in _over(metric, members, bound)]
                row[name]["over_bound"] = [j.model_dump() for j in judged]
                if judged and all(j.verdict == "host_load" for j in judged):
                    undecided.append(f"{metric} {name} of {cls} is {value:.3f}s > {bound:g}s, inconclusive (host "
                                     f"load): all {len(judged)} request(s) above the bound had the run's own "
                                     f"baseline as slow (first {judged[0].request_id}: {judged[0].reason})")
                    row[name]["verdict"] = "unknown"
                else:
                    problems.append(f"{metric} {name} of {cls} is {value:.3f}s > {bound:g}s "
                                    f"({len(samples)} samples)")
                    row[name]["verdict"] = "failed"
            else:
                row[name]["verdict"] = "passed"
        out[cls] = row
    return out


def _overlaps_fault(rec: RequestRecord, windows: list[tuple[float, float]]) -> bool:
    end = rec.end_time if rec.end_time is not None else float("inf")
    return any(rec.invoke_time <= b and a <= end for a, b in windows)


def _speedup(cfg: HitSpeedupConfig, measured: list[RequestRecord], everyone: list[RequestRecord],
             windows: list[tuple[float, float]], problems: list[str], undecided: list[str]) -> dict[str, Any]:
    def share(r: RequestRecord) -> float:
        s = r.cached_token_stats
        return (s.external_cache_hit_tokens / r.prompt_tokens) if s and r.prompt_tokens else 0.0

    hits = [r for r in measured if r.outcome == "ok" and r.ttft_s is not None
            and r.request_class in ("lmcache_hit_full", "lmcache_hit_partial") and share(r) >= cfg.min_hit_share]
    base = [r for r in everyone if r.outcome == "ok" and r.ttft_s is not None and r.request_class == "cold_miss"
            and (cfg.baseline_phases is None or r.phase in cfg.baseline_phases)]
    clean = [r for r in base if not _overlaps_fault(r, windows)]
    lengths = sorted({r.prompt_tokens for r in hits if r.prompt_tokens})
    rows: list[dict[str, Any]] = []
    for n in lengths:
        h = [r.ttft_s for r in hits if r.prompt_tokens == n]
        c = [r.ttft_s for r in clean if r.prompt_tokens == n]
        row: dict[str, Any] = {"prompt_tokens": n, "hit_samples": len(h), "cold_samples": len(c)}
        if len(h) >= cfg.min_samples and len(c) >= cfg.min_samples:
            row["hit_ttft_median_s"] = statistics.median(h)  # type: ignore[type-var]
            row["cold_ttft_median_s"] = statistics.median(c)  # type: ignore[type-var]
            row["ratio"] = row["cold_ttft_median_s"] / max(row["hit_ttft_median_s"], 1e-9)
            row["verdict"] = "passed" if row["ratio"] >= cfg.min_ratio else "failed"
        else:
            row["verdict"] = "unknown"
        rows.append(row)
    judged = [r for r in rows if r["verdict"] != "unknown"]
    for r in judged:
        if r["verdict"] == "failed":
            problems.append(
                f"hit brings no speedup at {r['prompt_tokens']} prompt tokens: median hit TTFT "
                f"{r['hit_ttft_median_s']:.3f}s vs cold {r['cold_ttft_median_s']:.3f}s (ratio {r['ratio']:.2f} < "
                f"{cfg.min_ratio:g}; {r['hit_samples']} hits, {r['cold_samples']} cold)")
    if not judged:
        undecided.append(
            f"hit speedup: too few samples: no prompt length has {cfg.min_samples} streamed hits "
            f"(>= {cfg.min_hit_share:.0%} of the prompt from LMCache) and {cfg.min_samples} streamed cold misses "
            f"outside faults ({len(hits)} hits, {len(clean)} cold of {len(base)} outside faults)")
    return {"lengths": rows, "hits": len(hits), "cold": len(clean), "cold_overlapping_faults": len(base) - len(clean),
            "min_ratio": cfg.min_ratio}


@register(NAME, SloConfig)
def check(history: Sequence[Op | dict[str, Any]], snapshots: Snapshots,
          config: SloConfig | dict[str, Any] | None = None) -> CheckResult:
    """TTFT/latency percentiles per request class, the lookup-timeout rate and the hit speedup.

    Args:
        history: the run's ops.
        snapshots: ``twin_baseline`` for the host-load rule (chaos/checks/host_load.py).
        config: SloConfig.
    Returns:
        CheckResult; details: ``ttft`` / ``latency`` (class -> samples and each percentile's
        value, bound and verdict), ``lookup_timeouts``, ``hit_speedup`` (per prompt length),
        ``problems``, ``undecided``.
    """
    cfg = coerce_config(config, SloConfig)
    everyone = requests(history)
    recs = [r for r in everyone if cfg.phases is None or r.phase in cfg.phases]
    problems: list[str] = []
    undecided: list[str] = []
    windows = host_load.fault_windows(history)
    details: dict[str, Any] = {"phases": cfg.phases, "min_samples": cfg.min_samples,
                               "ttft": _bounds("ttft", cfg.ttft, recs, cfg.min_samples, problems, undecided,
                                               everyone, windows, snapshots),
                               "latency": _bounds("latency", cfg.latency, recs, cfg.min_samples, problems,
                                                  undecided, everyone, windows, snapshots),
                               "host_load_rule": host_load.rule_text()}
    if cfg.max_lookup_timeout_rate is not None:
        looked = [r for r in recs if r.outcome == "ok" and r.cached_token_stats is not None
                  and (r.cached_token_stats.lookup or "miss") != "disabled"]
        timeouts = [r for r in looked if r.cached_token_stats and r.cached_token_stats.lookup == "timeout"]
        rate = len(timeouts) / len(looked) if looked else None
        details["lookup_timeouts"] = {"requests": len(looked), "timeouts": len(timeouts), "rate": rate,
                                      "bound": cfg.max_lookup_timeout_rate,
                                      "request_ids": [r.request_id for r in timeouts[:10]]}
        if len(looked) < cfg.min_samples:
            undecided.append(f"lookup timeouts: too few samples ({len(looked)} completed requests looked up; "
                             f"{cfg.min_samples} needed)")
        elif rate is not None and rate > cfg.max_lookup_timeout_rate:
            problems.append(f"{len(timeouts)} of {len(looked)} requests had their lookup time out "
                            f"({rate:.0%} > {cfg.max_lookup_timeout_rate:.0%})")
    if cfg.hit_speedup is not None:
        windows = [(f.applied_at, f.healed_at if f.healed_at is not None else float("inf"))
                   for f in faults(history) if f.applied_at is not None]
        details["hit_speedup"] = _speedup(cfg.hit_speedup, recs, everyone, windows, problems, undecided)
    details["problems"], details["undecided"] = problems, undecided
    lines = problems + undecided
    if problems:
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        return CheckResult(name=NAME, verdict="failed", summary=problems[0] + more, details=details)
    if undecided:
        more = f" (and {len(undecided) - 1} more)" if len(undecided) > 1 else ""
        return CheckResult(name=NAME, verdict="unknown", summary=undecided[0] + more, details=details)
    return CheckResult(name=NAME, verdict="passed", summary=f"every SLO bound met ({len(recs)} requests)",
                       details=details)
