"""Assemble a RunResult from a finished run: checks, stats, faults, phases, exit code."""

from __future__ import annotations

from typing import Any, Iterable

from chaos.checks.leaks import leaked_fields
from chaos.checks.requests import faults, op_dicts
from chaos.checks.result import CheckResult, Verdict, combine
from chaos.checks.snapshots import ServiceExit
from chaos.checks.evidence import unproven_windows
from chaos.report.model import (EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_INFRA, EXIT_PASSED, EXIT_UNPROVEN, UNPROVEN,
                                Durations, FaultSummary, InterruptInfo, PhaseSpan, RunResult, RunVerdict,
                                XfailInfo)
from chaos.stats import compute_stats, output_matches_from_checks


def exit_code(verdict: Verdict | RunVerdict, xfail: XfailInfo | None = None, error: str | None = None) -> int:
    """Exit code of `kvchaos run` for a run.

    Args:
        verdict: the combined verdict of the checks, or "passed (window not proven)".
        xfail: set when the scenario is expected to fail (known bug); a failure with
            ``xfail.unexpected`` checks (not the known bug's) is still 1.
        error: infrastructure error text (stack did not start, runner crashed).
    Returns:
        3 on an infrastructure error; else 4 when inconclusive; else 1 when failed (0 under
        xfail: the known bug showed, as expected); else 0 (also under xfail: "xpassed", which
        the report flags but which does not break the build, as pytest's non-strict xfail);
        5 for "passed (window not proven)" (also under xfail).
    """
    if error:
        return EXIT_INFRA
    if verdict == "unknown":
        return EXIT_INCONCLUSIVE
    if verdict == "failed":
        return EXIT_PASSED if xfail is not None and not xfail.unexpected else EXIT_FAILED
    if verdict == UNPROVEN:
        return EXIT_UNPROVEN
    return EXIT_PASSED


def phases_from_history(history: Iterable[Any]) -> list[PhaseSpan]:
    """Phase spans (first to last op time per phase name), in order of first appearance."""
    spans: dict[str, PhaseSpan] = {}
    for op in op_dicts(history):
        name = op.get("phase")
        if not name:
            continue
        t = float(op.get("time") or 0.0)
        span = spans.get(name)
        if span is None:
            spans[name] = PhaseSpan(name=name, start=t, end=t)
        else:
            span.start, span.end = min(span.start, t), max(span.end, t)
    return list(spans.values())


def faults_from_history(history: Iterable[Any]) -> list[FaultSummary]:
    """Faults applied in the run, with apply/heal times and the evidence recorded at heal."""
    return [FaultSummary(fault_id=f.fault_id, kind=f.kind, phase=f.phase, applied_at=f.applied_at,
                         healed_at=f.healed_at, params=f.params, evidence=f.evidence, bit=f.bit,
                         trigger=f.trigger, error=f.error)
            for f in faults(history)]


def build_result(*, run_id: str, scenario: str, history: Iterable[Any], checks: list[CheckResult],
                 seed: int | None = None, description: str = "", scenario_path: str | None = None,
                 stack: str | None = None, started_at: str | None = None,
                 deadline_s: float | None = 60.0, xfail: XfailInfo | dict | Any | None = None,
                 durations: Durations | dict | None = None,
                 service_exits: Iterable[ServiceExit | dict] = (), engine_bugs: Iterable[str] = (),
                 error: str | None = None, chunk_size: int = 256,
                 interrupted: InterruptInfo | dict | None = None,
                 proxy: dict[str, str] | None = None) -> RunResult:
    """Build result.json's model for one run.

    Args:
        run_id: the run directory's name under reports/.
        scenario: scenario name; history: the run's ops (dicts or `Op` models).
        checks: the check results (chaos.checks.run_checks).
        deadline_s: request deadline (s) used for goodput (liveness request_deadline_s).
        xfail: the scenario's xfail block (model or dict with reason/evidence/upstream/checks/leaks)
            or None. A failed run is XFAIL only when no check beyond ``checks`` failed and, with
            ``leaks``, no leak field beyond those (``source.field``) leaked; else FAILED, with
            ``xfail.unexpected`` naming what went beyond (``liveness``, ``leaks (engine.x)``).
        durations: per-stage wall-clock seconds; service_exits: from the snapshots.
        error: infrastructure error text; forces verdict "unknown" and exit code 3.
        chunk_size: LMCache chunk size in tokens, for the hit statistics.
        interrupted: a signal stopped the run (chaos/interrupts.py); forces verdict
            "interrupted" and exit code 128 + the signal's number (its ``exit_code``).
        proxy: the stack's fault proxy (``Stack.proxy_info``), recorded as is.
    Returns:
        RunResult with verdict = combine(checks) ("passed (window not proven)" instead of
        "passed" when the `evidence` check lists windows nothing proved), stats, faults, phases
        and exit_code.
    """
    ops = op_dicts(history)
    if isinstance(interrupted, dict):
        interrupted = InterruptInfo.model_validate(interrupted)
    verdict: RunVerdict = "interrupted" if interrupted else "unknown" if error else combine(checks)
    if verdict == "passed" and unproven_windows(checks):
        verdict = UNPROVEN
    xf: XfailInfo | None = None
    if xfail is not None:
        raw = xfail if isinstance(xfail, dict) else (xfail.model_dump() if hasattr(xfail, "model_dump") else vars(xfail))
        xf = XfailInfo.model_validate({k: raw.get(k) for k in ("reason", "evidence", "upstream", "checks", "leaks")
                                       if raw.get(k) is not None})
        xf.outcome = {"failed": "xfailed", "passed": "xpassed"}.get(verdict)  # type: ignore[assignment]
        other = sorted({c.name for c in checks if c.verdict == "failed"} - set(xf.checks or ())) if xf.checks else []
        if xf.leaks is not None:
            # A field the known bug does not leave held (engine blocks beside LMCache's known
            # read-lock leak) is another bug, not the expected failure.
            beyond = sorted(leaked_fields(checks) - set(xf.leaks))
            if beyond:
                other.append(f"leaks ({', '.join(beyond)})")
        if verdict == "failed" and other:
            # A check the known bug does not explain failed: not the expected failure.
            xf.outcome, xf.unexpected = None, other
    if isinstance(durations, dict):
        durations = Durations.model_validate(durations)
    return RunResult(
        run_id=run_id, scenario=scenario, description=description, scenario_path=scenario_path,
        stack=stack, proxy=proxy, seed=seed, started_at=started_at, verdict=verdict,
        exit_code=interrupted.exit_code if interrupted else exit_code(verdict, xf, error), checks=list(checks),
        stats=compute_stats(ops, deadline_s, chunk_size=chunk_size,
                            matches=output_matches_from_checks(checks, ops)), faults=faults_from_history(ops),
        phases=phases_from_history(ops),
        service_exits=[e if isinstance(e, ServiceExit) else ServiceExit.model_validate(e) for e in service_exits],
        durations=durations or Durations(), xfail=xf, engine_bugs=list(engine_bugs), error=error,
        interrupted=interrupted)
