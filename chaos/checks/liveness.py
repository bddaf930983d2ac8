"""liveness: every request ends, with output or a clear error, within a bound; nothing dies
that no fault killed.

Catches livelocks (F4: a failed load retried forever), wedged requests, and crashes (F5, F7,
F10: a worker or the cache server died). Three rules:

1. every client invoke has a completion (ok/fail/info) within its deadline: its phase's entry
   of `phase_deadlines`, else `request_deadline_s`;
2. the fraction of requests that ended badly (`fail`, or `info` that was not an abort made on
   purpose) is at most `allow_failed_fraction`; aborts the workload made on purpose (info with
   `aborted: true`) do not count, nor do the errors `allowed_failures` names (by phase, by a
   fault in place during the request's life, by error text; each rule's `at_most` bounds how
   many it excuses, and a rule matched by more fails the check);
3. every service exit in `snapshots.service_exits` was caused by a fault (`killed_by_fault`).

A late request (one that completed after the deadline, or that the client gave up on at the
deadline: info "deadline exceeded") is judged against the run's own baseline
(chaos/checks/host_load.py): with the recompute twin as slow for the same prompt (within 3x;
the twin, which no fault touches, is the only baseline for a request a fault was in place
for), or, with no fault in place and no twin figure, the fault-free peers of its phase as slow
(median at least half the deadline), it is host load: not a failure, not a pass, and, when the
client gave up on it at the deadline, it does not count towards rule 2 (an error that came late
is still an error). A late request stuck while the twin answered fast, or with a fault in place
and no twin figure, is late as before. A request that never completed and an unexplained exit
are never host load.

Verdicts: failed if a rule is broken; unknown if no request was invoked, or if every broken
deadline was host load (the summary gives the figures); else passed.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

from chaos.checks import host_load
from chaos.checks.config import AllowedFailure, LivenessConfig
from chaos.checks.registry import coerce_config, register
from chaos.checks.requests import RequestRecord, requests
from chaos.checks.result import CheckResult
from chaos.checks.snapshots import Snapshots
from chaos.history import Op

NAME = "liveness"
#: The client's error text for a request it gave up on at the deadline
#: (chaos/workload/client.py ``CompletionClient.complete``).
DEADLINE_ERROR = "deadline exceeded"


def late(reqs: list[RequestRecord], deadline_s: float | Callable[[str | None], float]) -> list[RequestRecord]:
    """Requests that completed after their deadline or that the client gave up on at it.

    Args:
        reqs: the run's requests.
        deadline_s: the deadline (s), or a function of the request's phase giving it
            (``LivenessConfig.deadline_for``).
    """
    bound = deadline_s if callable(deadline_s) else (lambda _phase: deadline_s)
    return [r for r in reqs if r.latency_s is not None
            and (r.latency_s > bound(r.phase) or (r.latency_s >= bound(r.phase) and r.outcome == "info"
                                                  and not r.aborted and r.error == DEADLINE_ERROR))]


def allowed(rec: RequestRecord, rule: AllowedFailure, windows: Sequence[host_load.FaultWindow]) -> bool:
    """Whether ``rec`` matches every field ``rule`` gives (phase, fault in place during its
    life, error text)."""
    if rule.phase is not None and rec.phase != rule.phase:
        return False
    if rule.fault is not None and rule.fault not in host_load.faults_during(rec, windows):
        return False
    return rule.error_matches is None or re.search(rule.error_matches, rec.error or "") is not None


def excused_failures(bad: list[RequestRecord], rules: list[AllowedFailure],
                     windows: Sequence[host_load.FaultWindow]) -> tuple[dict[str, int], list[str]]:
    """The failed requests that ``allowed_failures`` names, and the rules they overran.

    Each failed request goes to the first rule it matches; a rule with ``at_most`` excuses that
    many (in invoke order) and no more.

    Returns:
        ``(excused, overrun)``: request id -> index of the rule that excused it; one line per rule
        that more requests matched than its ``at_most``.
    """
    excused: dict[str, int] = {}
    counts = [0] * len(rules)
    overrun: list[str] = []
    for r in sorted(bad, key=lambda x: x.invoke_time):
        i = next((i for i, rule in enumerate(rules) if allowed(r, rule, windows)), None)
        if i is None:
            continue
        counts[i] += 1
        if rules[i].at_most is None or counts[i] <= rules[i].at_most:
            excused[r.request_id] = i
    for i, rule in enumerate(rules):
        if rule.at_most is not None and counts[i] > rule.at_most:
            overrun.append(f"allowed_failures[{i}] matched {counts[i]} failed requests, at most {rule.at_most} allowed")
    return excused, overrun


def slow_requests(history: Sequence[Op | dict[str, Any]],
                  config: LivenessConfig | dict[str, Any] | None = None) -> list[RequestRecord]:
    """The late requests whose judgement reads the twin baseline (every one that completed, a
    fault in place or not): the runner times the twin on their prompts (chaos/runner/baseline.py)."""
    cfg = coerce_config(config, LivenessConfig)
    return host_load.wanted(late(requests(history), cfg.deadline_for))


@register(NAME, LivenessConfig)
def check(history: Sequence[Op | dict[str, Any]], snapshots: Snapshots,
          config: LivenessConfig | dict[str, Any] | None = None) -> CheckResult:
    """Check completion within the deadline, the failure budget, and unexplained process exits.

    Args:
        history: the run's ops (dicts or `Op` models).
        snapshots: uses `service_exits` and `twin_baseline`.
        config: LivenessConfig or its dict.
    Returns:
        CheckResult; details: `invoked`, `ok`, `failed` (ids), `aborted` (count),
        `never_completed` (ids), `late` (list of {request_id, latency_s, outcome, verdict,
        reason}: late as before), `host_load` (the late requests judged host load, with their
        figures: chaos.checks.host_load.Judgement), `host_load_rule`, `twin_baseline`,
        `failed_fraction`, `unexpected_exits` (list of service exits).
    """
    cfg = coerce_config(config, LivenessConfig)
    reqs = requests(history)
    never = [r.request_id for r in reqs if r.outcome is None]
    windows = host_load.fault_windows(history)
    judged = [host_load.judge(r, "latency", cfg.deadline_for(r.phase), reqs, windows, snapshots.twin_baseline)
              for r in late(reqs, cfg.deadline_for)]
    excused = {j.request_id for j in judged if j.verdict == "host_load"}
    # Host load excuses the lateness, never an error: only a request the client gave up on at
    # the deadline leaves the error count with it.
    gave_up = {r.request_id for r in reqs if r.request_id in excused and r.outcome == "info"
               and r.error == DEADLINE_ERROR}
    late_rows = [{"request_id": j.request_id, "latency_s": round(j.value_s or 0.0, 3),
                  "outcome": next(r.outcome for r in reqs if r.request_id == j.request_id),
                  "verdict": j.verdict, "reason": j.reason}
                 for j in judged if j.verdict != "host_load"]
    aborted = [r for r in reqs if r.outcome == "info" and r.aborted]
    errors = [r for r in reqs if (r.outcome == "fail" or (r.outcome == "info" and not r.aborted))
              and r.request_id not in gave_up]
    excused_by, overrun = excused_failures(errors, cfg.allowed_failures, windows)
    bad = [r for r in errors if r.request_id not in excused_by]
    counted = len(reqs) - len(aborted) - len(gave_up) - len(excused_by)
    frac = len(bad) / counted if counted else 0.0
    exits = [e.model_dump() for e in snapshots.service_exits if not e.killed_by_fault]
    twin = snapshots.twin_baseline
    details = {"invoked": len(reqs), "ok": sum(r.outcome == "ok" for r in reqs),
               "failed": [r.request_id for r in bad], "errors": {r.request_id: r.error for r in bad[:20]},
               "aborted": len(aborted), "never_completed": never, "late": late_rows,
               "host_load": [j.model_dump() for j in judged if j.verdict == "host_load"],
               "host_load_rule": host_load.rule_text(),
               "twin_baseline": None if twin is None else {
                   "concurrency": twin.concurrency, "timed": len(twin.timings), "load_average": twin.load_average,
                   "took_s": twin.took_s, "error": twin.error},
               "failed_fraction": frac, "allow_failed_fraction": cfg.allow_failed_fraction,
               "allowed_failures": {rid: f"allowed_failures[{i}]" for rid, i in excused_by.items()},
               "request_deadline_s": cfg.request_deadline_s,
               "phase_deadlines": {d.phase: d.request_deadline_s for d in cfg.phase_deadlines},
               "unexpected_exits": exits}
    problems: list[str] = []
    if exits:
        e = exits[0]
        problems.append(f"service {e['service']} exited (returncode {e['returncode']}) at "
                        f"t={e['time']:.1f}s and no fault killed it"
                        + (f" (+{len(exits) - 1} more exits)" if len(exits) > 1 else ""))
    if never:
        problems.append(f"{len(never)} request(s) never completed (first: {never[0]})")
    if late_rows:
        first = late_rows[0]
        first_phase = next(r.phase for r in reqs if r.request_id == first["request_id"])
        problems.append(f"{len(late_rows)} request(s) took longer than their deadline "
                        f"(first: {first['request_id']}, {first['latency_s']:.1f}s > "
                        f"{cfg.deadline_for(first_phase):g}s: {first['reason']})")
    problems.extend(overrun)
    if frac > cfg.allow_failed_fraction:
        first_bad = bad[0]
        why = f": {first_bad.error}" if first_bad.error else ""
        problems.append(f"{len(bad)}/{counted} requests ended with an error ({frac:.0%} > allowed "
                        f"{cfg.allow_failed_fraction:.0%}; first {first_bad.request_id}{why})")
    if problems:
        return CheckResult(name=NAME, verdict="failed", summary="; ".join(problems), details=details)
    if not reqs:
        return CheckResult(name=NAME, verdict="unknown", summary="no request was invoked", details=details)
    if excused:
        first_j = next(j for j in judged if j.verdict == "host_load")
        return CheckResult(name=NAME, verdict="unknown",
                           summary=(f"inconclusive (host load): {len(excused)} request(s) missed the "
                                    f"{first_j.bound_s:g}s deadline while the run's own baseline was as slow "
                                    f"(first {first_j.request_id}: {first_j.reason}); no other problem"),
                           details=details)
    within = f"{cfg.request_deadline_s:g}s" + (" (or their phase's deadline)" if cfg.phase_deadlines else "")
    allowed_note = f", {len(excused_by)} allowed by allowed_failures" if excused_by else ""
    return CheckResult(name=NAME, verdict="passed",
                       summary=(f"all {len(reqs)} requests ended within {within} "
                                f"({len(bad)} errors{allowed_note}, {len(aborted)} aborted on purpose); "
                                "no unexplained exits"),
                       details=details)
