"""liveness: every request ends, with output or a clear error, within a bound; nothing dies
that no fault killed.

Catches livelocks (F4: a failed load retried forever), wedged requests, and crashes (F5, F7,
F10: a worker or the cache server died). Three rules:

1. every client invoke has a completion (ok/fail/info) within `request_deadline_s`;
2. the fraction of requests that ended badly (`fail`, or `info` that was not an abort made on
   purpose) is at most `allow_failed_fraction`; aborts the workload made on purpose (info with
   `aborted: true`) do not count;
3. every service exit in `snapshots.service_exits` was caused by a fault (`killed_by_fault`).

Verdicts: failed if a rule is broken; unknown if no request was invoked; else passed.
"""

from __future__ import annotations

from typing import Any, Sequence

from chaos.checks.config import LivenessConfig
from chaos.checks.registry import coerce_config, register
from chaos.checks.requests import requests
from chaos.checks.result import CheckResult
from chaos.checks.snapshots import Snapshots
from chaos.history import Op

NAME = "liveness"


@register(NAME, LivenessConfig)
def check(history: Sequence[Op | dict[str, Any]], snapshots: Snapshots,
          config: LivenessConfig | dict[str, Any] | None = None) -> CheckResult:
    """Check completion within the deadline, the failure budget, and unexplained process exits.

    Args:
        history: the run's ops (dicts or `Op` models).
        snapshots: uses `service_exits`.
        config: LivenessConfig or its dict.
    Returns:
        CheckResult; details: `invoked`, `ok`, `failed` (ids), `aborted` (count),
        `never_completed` (ids), `late` (list of {request_id, latency_s}), `failed_fraction`,
        `unexpected_exits` (list of service exits).
    """
    cfg = coerce_config(config, LivenessConfig)
    reqs = requests(history)
    never = [r.request_id for r in reqs if r.outcome is None]
    late = [{"request_id": r.request_id, "latency_s": round(r.latency_s, 3), "outcome": r.outcome}
            for r in reqs if r.latency_s is not None and r.latency_s > cfg.request_deadline_s]
    aborted = [r for r in reqs if r.outcome == "info" and r.aborted]
    bad = [r for r in reqs if r.outcome == "fail" or (r.outcome == "info" and not r.aborted)]
    counted = len(reqs) - len(aborted)
    frac = len(bad) / counted if counted else 0.0
    exits = [e.model_dump() for e in snapshots.service_exits if not e.killed_by_fault]
    details = {"invoked": len(reqs), "ok": sum(r.outcome == "ok" for r in reqs),
               "failed": [r.request_id for r in bad], "errors": {r.request_id: r.error for r in bad[:20]},
               "aborted": len(aborted), "never_completed": never, "late": late,
               "failed_fraction": frac, "allow_failed_fraction": cfg.allow_failed_fraction,
               "request_deadline_s": cfg.request_deadline_s, "unexpected_exits": exits}
    problems: list[str] = []
    if exits:
        e = exits[0]
        problems.append(f"service {e['service']} exited (returncode {e['returncode']}) at "
                        f"t={e['time']:.1f}s and no fault killed it"
                        + (f" (+{len(exits) - 1} more exits)" if len(exits) > 1 else ""))
    if never:
        problems.append(f"{len(never)} request(s) never completed (first: {never[0]})")
    if late:
        problems.append(f"{len(late)} request(s) took longer than {cfg.request_deadline_s:g}s "
                        f"(first: {late[0]['request_id']}, {late[0]['latency_s']:.1f}s)")
    if frac > cfg.allow_failed_fraction:
        first = bad[0]
        why = f": {first.error}" if first.error else ""
        problems.append(f"{len(bad)}/{counted} requests ended with an error ({frac:.0%} > allowed "
                        f"{cfg.allow_failed_fraction:.0%}; first {first.request_id}{why})")
    if problems:
        return CheckResult(name=NAME, verdict="failed", summary="; ".join(problems), details=details)
    if not reqs:
        return CheckResult(name=NAME, verdict="unknown", summary="no request was invoked", details=details)
    return CheckResult(name=NAME, verdict="passed",
                       summary=(f"all {len(reqs)} requests ended within {cfg.request_deadline_s:g}s "
                                f"({len(bad)} errors, {len(aborted)} aborted on purpose); no unexplained exits"),
                       details=details)
