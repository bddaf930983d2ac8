"""``kvchaos diagnose RUN_DIR [REQUEST_ID...]``: why a run's requests failed.

    RUN_DIR (result.json, history.jsonl, snapshots.json)
      ├─ --attach FILE: the stack `kvchaos stack up FILE` left running, as it is
      └─ default: a fresh stack of the run's scenario (same stack variables and engine bugs),
         warmed by replaying, one by one, the requests the run completed before the last
         request diagnosed (faults are not replayed: a fault-dependent failure reads transient)
    ─> chaos.diagnose.diagnose_failures ─> RUN_DIR/diagnosis.json, report.html re-rendered

Exit codes: 0 diagnosed (or nothing failed), 2 RUN_DIR or a request id is invalid, 3 the stack
did not start.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer


def _err(msg: str, code: int) -> typer.Exit:
    print(f"error: {msg}", file=sys.stderr)
    return typer.Exit(code)


def nothing_to_diagnose(checks) -> str:
    """What ``kvchaos diagnose`` answers for a run whose failures name no request: a leak (a
    session, a lock, a running request left after quiesce) is the stack's state, not a
    request's answer, so there is nothing to replay; the failed checks are named with their
    summaries, which say what leaked."""
    failed = [c for c in checks if c.verdict == "failed"]
    line = "nothing to diagnose: no request failed recompute_equivalence, isolation or hit_quality"
    if not failed:
        return line
    return line + "; failed: " + "; ".join(f"{c.name} ({c.summary})" if c.summary else c.name for c in failed) + (
        " (a leak is the stack's state after quiesce, not a request's answer: the leaks check names its "
        "source and field)" if any(c.name == "leaks" for c in failed) else "")


def warm_stack(settings, history, before: float, limit: int, say=lambda _m: None,
               until: float | None = None) -> int:
    """Replay, in invoke order and one at a time, the requests the run completed that were
    invoked before ``before`` (s since run start), at most ``limit``, and none after
    ``time.monotonic()`` passes ``until``; returns how many."""
    from chaos.checks.requests import requests
    from chaos.diagnose.replay import replay

    n = 0
    for rec in requests(history):
        if rec.outcome != "ok" or rec.invoke_time >= before or not rec.prompt_token_ids or n >= limit:
            continue
        if until is not None and time.monotonic() >= until:
            say(f"warm-up stopped after {n} requests: its share of the time budget is spent")
            break
        inv = rec.invoke_value
        left = 120.0 if until is None else max(1.0, min(120.0, until - time.monotonic()))
        replay(settings.engine_url, "fresh", rec.prompt_token_ids, int(inv.get("max_tokens") or 1),
               cache_salt=inv.get("cache_salt"), request_id=f"kvchaos-warm-{rec.request_id}", timeout_s=left)
        n += 1
    say(f"warmed the stack with {n} requests of the run")
    return n


def diagnose(
    run_dir: Path = typer.Argument(..., help="a run folder, reports/<run-id>"),
    request_ids: list[str] = typer.Argument(None, help="requests to diagnose (default: the first failing ones)"),
    limit: int = typer.Option(3, "--limit", min=1, help="diagnose the first N failing requests"),
    budget: float = typer.Option(300.0, "--budget", min=1.0,
                                 help="seconds the command may spend from its start (stack start-up, warm-up "
                                 "and diagnosis; the stack's shutdown comes after)"),
    attach: Path | None = typer.Option(None, "--attach", help="diagnose on the stack `kvchaos stack up FILE` "
                                       "started (as it is, no warm-up) instead of a fresh one"),
    stack_file: Path | None = typer.Option(None, "--stack", help="bring up this stack file instead of the run's"),
    backend: str = typer.Option("local", "--backend", "-b", envvar="KVCHAOS_BACKEND", help="local or compose"),
    warm_limit: int = typer.Option(500, "--warm-limit", help="replay at most this many earlier requests"),
) -> None:
    """Diagnose a run's failing requests (recompute_equivalence, isolation, hit_quality): A/B replay, first divergence, prefix length against
    LMCache's lookup, served KV against the witness KV chunk by chunk and layer by layer, key
    identity, and a verdict in the false-hit triage's terms. Writes RUN_DIR/diagnosis.json and
    the "Why" section of RUN_DIR/report.html."""
    from chaos.checks.requests import requests
    from chaos.checks.snapshots import Snapshots
    from chaos.diagnose.diagnose import DiagnoseOptions, diagnose_failures, failing_requests, write_diagnosis
    from chaos.report.writer import ReportError, read_history, read_result, render_report

    t0 = time.monotonic()
    deadline = t0 + budget
    run_dir = Path(run_dir)
    try:
        result = read_result(run_dir)
        history = read_history(run_dir / result.paths.history)
    except ReportError as exc:
        raise _err(str(exc), 2) from None
    snaps = Snapshots()
    if (run_dir / "snapshots.json").is_file():
        snaps = Snapshots.model_validate_json((run_dir / "snapshots.json").read_text())
    recs = {r.request_id: r for r in requests(history)}
    unknown = [r for r in request_ids or [] if r not in recs]
    if unknown:
        raise _err(f"{run_dir}: no request {unknown[0]!r} in the history", 2)
    chosen = list(request_ids or []) or [rid for rid, _, _ in failing_requests(result.checks, history,
                                                                               snaps.chunk_size)][:limit]
    if not chosen:
        typer.echo(nothing_to_diagnose(result.checks))
        raise typer.Exit(0)
    say = lambda m: typer.echo(m, err=True)  # noqa: E731
    opts = DiagnoseOptions(limit=limit, budget_s=budget, deadline=deadline)
    if attach is not None:
        from chaos.stack.detached import attach_detached, detached_state_dir

        state = detached_state_dir(attach)
        if not (state / "state.json").exists():
            raise _err(f"stack {attach} is not up (`kvchaos stack up {attach}` first)", 3)
        stack, mode, pool = attach_detached(state), "live", None
    else:
        from chaos.runner.stacks import StackPool
        from chaos.scenario.loader import load_scenario
        from chaos.stack.base import StackError, new_run_id
        from chaos.yamlsource import ConfigError

        if not result.scenario_path or not Path(result.scenario_path).is_file():
            raise _err(f"{run_dir}: the run's scenario file {result.scenario_path!r} is gone; use --attach", 2)
        try:
            scenario = load_scenario(result.scenario_path)
        except ConfigError as exc:
            raise _err(str(exc), 2) from None
        scenario.engine.bugs = list(result.engine_bugs)
        pool = StackPool(backend, run_dir / "diagnose-stack")
        try:
            stack = pool.acquire(Path(stack_file or result.stack or scenario.stack), scenario.stack_variables(),
                                 say=say)
        except (StackError, ConfigError) as exc:
            pool.close()
            raise _err(f"stack did not start: {exc}", 3) from None
        mode = "replayed"
        say(f"stack up after {time.monotonic() - t0:.0f}s of the {budget:g}s budget")
    try:
        if mode == "replayed":
            last = max(recs[r].invoke_time for r in chosen)
            # The warm-up gets at most half of what is left; the diagnosis the rest.
            warm_stack(stack.settings, history, last, warm_limit, say,
                       until=time.monotonic() + max(0.0, deadline - time.monotonic()) / 2)
        diag = diagnose_failures(history, snaps.expected, result.checks, stack.settings, run_id=result.run_id,
                                 scenario=result.scenario, options=opts, request_ids=chosen, mode=mode, say=say)
    finally:
        if pool is not None:
            pool.close()
    write_diagnosis(run_dir, diag)
    try:
        render_report(run_dir)
    except ReportError as exc:
        say(f"report not re-rendered: {exc}")
    for d in diag.requests:
        typer.echo(f"req {d.request_id} ({d.check}): {d.title}")
        for line in d.evidence:
            typer.echo(f"  - {line}")
    for s in diag.skipped:
        typer.echo(f"req {s.request_id}: not diagnosed ({s.reason})")
    typer.echo(json.dumps({"diagnosis": str(run_dir / "diagnosis.json"), "mode": mode,
                           "seconds": round(time.monotonic() - t0, 1)}))
