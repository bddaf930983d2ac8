"""leaks: once the stack is quiet, every lock, pin, session, staging byte and held block is back.

The runner polls each leak source (x-kvchaos `leak_sources`: an HTTP endpoint, JSON or
Prometheus text, and the fields to read from it) every `poll_interval_s` until all fields are
back at their baseline or `quiesce_s` passes, and records each reading in
`snapshots.leak_samples`. The baseline is 0, or, for a source with `baseline: before_faults`
(gauges such as vLLM's `vllm:num_requests_running` or `vllm:kv_cache_usage_perc`), what the
source read before the first phase (`snapshots.leak_baselines`). A counter still off its
baseline at the final reading is a leak (F8 pins never released, F9 locks and sessions left by
an abort, blocks an engine never freed).

Verdicts:
- failed: some source's final reading has a field != 0 (baseline zero) or above its baseline
  (before_faults); details list the last value per field, its peak, its baseline, and how long
  the runner waited.
- unknown: a source never answered (only errors or nothing at all), a field was missing from
  the final reading, a baseline could not be read, or no leak source was polled.
- passed: every source's final reading has every field back at its baseline.

Locks a TTL freed instead of their holder: LMCache's L1 read locks expire
``--l1-read-ttl-seconds`` after their last lock, and its ``read_locked_count`` then drops to 0
exactly as when the lock is freed, so with a short TTL a lock the engine never freed looked like a
clean quiesce. The reference stack's ``lmcache-lock-ledger`` source reads the ledger that its
LMCache server keeps (chaos/stack/lmcache_locks.py): ``read_locks_expired``, the read locks that
LMCache no longer holds and no holder freed, on any TTL; with ``baseline: before_faults`` it must
not grow during the run. A field whose name says ``expired`` is reported as such ("N read lock(s)
expired by LMCache's TTL instead of being freed").

With ``back_within: {s, phase}`` a pass counts only when that final reading came at most ``s``
seconds after the start of ``phase`` (the runner's ``phase`` op; default the first phase):
a leak that the system under test's TTL frees (LMCache's L1 read locks expire
``--l1-read-ttl-seconds`` after their last lock, LMCache 0.5.6 ``TTLLock``) looks the same as
no leak once the TTL has passed, so a later pass is "unknown" (a stretched run), never
"passed". A failure stays a failure.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from chaos.checks.config import LeaksConfig
from chaos.checks.registry import coerce_config, register
from chaos.checks.requests import phase_starts
from chaos.checks.result import CheckResult
from chaos.checks.snapshots import LeakSample, Snapshots
from chaos.history import Op

NAME = "leaks"


def _source_names(cfg: LeaksConfig, snapshots: Snapshots) -> list[str]:
    names: list[str] = []
    for src in cfg.sources or []:
        names.append(src.name)
    for n in snapshots.leak_sources + [s.source for s in snapshots.leak_samples] + [e.source for e in snapshots.leak_errors]:
        if n not in names:
            names.append(n)
    return names


def _needs(cfg: LeaksConfig) -> set[str]:
    # The scenario's own sources replace the stack's.
    return set() if cfg.sources is not None else {"leak_sources"}


@register(NAME, LeaksConfig, needs_for=_needs)
def check(history: Sequence[Op | dict[str, Any]], snapshots: Snapshots,
          config: LeaksConfig | dict[str, Any] | None = None) -> CheckResult:
    """Decide from the last reading of each leak source whether anything stayed held.

    Args:
        history: the runner's ``phase`` ops, read only for ``back_within``.
        snapshots: uses `leak_sources`, `leak_samples`, `leak_errors`, `quiesce_waited_s`.
        config: LeaksConfig or its dict (`quiesce_s` is reported when the runner did not
            record how long it waited).
    Returns:
        CheckResult; details: `waited_s`, `sources` (name -> {"final": {field: value},
        "peak": {field: value}, "time": s, "samples": n, "errors": n, "last_error": str}),
        `leaked` (list of {source, field, value, peak}); `back_within` ({phase, within_s,
        back_at, took_s, problem}) when a pass came too late for ``back_within``.
    """
    cfg = coerce_config(config, LeaksConfig)
    waited = snapshots.quiesce_waited_s if snapshots.quiesce_waited_s is not None else cfg.quiesce_s
    names = _source_names(cfg, snapshots)
    sources: dict[str, dict[str, Any]] = {}
    leaked: list[dict[str, Any]] = []
    unread: list[str] = []
    missing_fields: list[str] = []
    for name in names:
        samples: list[LeakSample] = sorted((s for s in snapshots.leak_samples if s.source == name),
                                           key=lambda s: s.time)
        errors = [e for e in snapshots.leak_errors if e.source == name]
        info: dict[str, Any] = {"samples": len(samples), "errors": len(errors),
                                "last_error": errors[-1].error if errors else None}
        sources[name] = info
        if not samples:
            unread.append(name)
            continue
        final = samples[-1]
        peak: dict[str, float] = {}
        for s in samples:
            for f, v in s.values.items():
                if v is not None:
                    peak[f] = max(peak.get(f, v), v)
        info.update(final=final.values, peak=peak, time=final.time)
        base = snapshots.leak_baselines.get(name)
        if base is not None:
            info["baseline"] = base
        for field, value in final.values.items():
            if value is None:
                missing_fields.append(f"{name}.{field}")
            elif base is not None:
                if base.get(field) is None:
                    missing_fields.append(f"{name}.{field} (baseline before the faults)")
                elif value > base[field]:
                    leaked.append({"source": name, "field": field, "value": value,
                                   "peak": peak.get(field, value), "baseline": base[field]})
            elif value != 0:
                leaked.append({"source": name, "field": field, "value": value, "peak": peak.get(field, value)})
    details = {"waited_s": waited, "sources": sources, "leaked": leaked,
               "unread_sources": unread, "missing_fields": missing_fields}
    if leaked:
        def show(xs: list[dict[str, Any]]) -> str:
            return ", ".join(f"{x['source']}.{x['field']}={x['value']:g}"
                             + (f" (baseline {x['baseline']:g})" if "baseline" in x else "") for x in xs)

        expired = [x for x in leaked if "expired" in x["field"]]
        still = [x for x in leaked if "expired" not in x["field"]]
        parts = []
        if expired:
            details["expired"] = expired
            n = sum(x["value"] - x.get("baseline", 0) for x in expired)
            parts.append(f"{n:g} lock(s) expired by a TTL instead of being freed: {show(expired)}")
        if still:
            parts.append(f"still held after {waited:g}s of quiesce: {show(still)}")
        return CheckResult(name=NAME, verdict="failed", summary="; ".join(parts), details=details)
    if not names:
        return CheckResult(name=NAME, verdict="unknown",
                           summary="no leak source was polled: nothing to decide on", details=details)
    if unread:
        why = "; ".join(f"{n}: {sources[n]['last_error'] or 'never polled'}" for n in unread)
        return CheckResult(name=NAME, verdict="unknown",
                           summary=f"leak source could not be read: {why}", details=details)
    if missing_fields:
        return CheckResult(name=NAME, verdict="unknown",
                           summary=f"field missing from the final reading: {', '.join(missing_fields)}",
                           details=details)
    late = _too_late(cfg, history, sources)
    if late is not None:
        details["back_within"] = late
        return CheckResult(name=NAME, verdict="unknown", summary=late["problem"], details=details)
    return CheckResult(name=NAME, verdict="passed",
                       summary=f"all counters of {', '.join(names)} are back at their baseline after quiesce",
                       details=details)


def _too_late(cfg: LeaksConfig, history: Sequence[Op | dict[str, Any]],
              sources: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """What broke ``back_within`` on a pass (None: kept, or not declared)."""
    within = cfg.back_within
    if within is None:
        return None
    starts = phase_starts(history)
    ref = within.phase or next(iter(starts), None)
    start = starts.get(ref) if ref is not None else None
    back_at = max(float(info["time"]) for info in sources.values() if "time" in info)
    if start is None:
        return {"phase": ref, "within_s": within.s, "back_at": back_at,
                "problem": f"inconclusive: back_within counts from the start of phase {ref}, which the "
                "history does not record (the phase never started)"}
    took = back_at - start
    if took <= within.s:
        return None
    return {"phase": ref, "within_s": within.s, "back_at": back_at, "took_s": took,
            "problem": f"inconclusive: back at baseline only {took:.1f}s after the start of phase {ref}, later than "
            f"back_within {within.s:g}s: a TTL may have freed what the run should have seen held "
            "(the run is stretched)"}


def leaked_fields(checks: Iterable[Any]) -> frozenset[str]:
    """The leak fields a run's ``leaks`` check found held, as ``source.field``.

    Args:
        checks: the run's check results: CheckResult objects or their dicts (result.json's
            ``checks``), each with ``name``, ``verdict`` and ``details``; the failed ``leaks``
            one's ``details.leaked`` is a list of {source, field, ...} (:func:`check`).

    Returns:
        e.g. ``{"lmcache.read_locked_count", "engine.blocks_held_by_requests"}``; empty when the
        leaks check did not fail or is absent.
    """
    out: set[str] = set()
    for c in checks:
        get = c.get if isinstance(c, dict) else (lambda k, c=c: getattr(c, k, None))
        if get("name") != "leaks" or get("verdict") != "failed":
            continue
        for x in (get("details") or {}).get("leaked") or ():
            if isinstance(x, dict) and x.get("source") and x.get("field"):
                out.add(f"{x['source']}.{x['field']}")
    return frozenset(out)
