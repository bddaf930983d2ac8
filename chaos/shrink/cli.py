"""``kvchaos shrink RUN_DIR``: the smallest scenario that still fails the run's check.

Candidates run on one reused stack (chaos/runner/stacks.py StackPool), with diagnosis off; a run
with planted engine bugs gets control runs on the clean engine (the result must pass there); each
candidate's report folder is removed once judged (the final verification's last one is kept
under ``RUN_DIR/shrink/``). Writes ``RUN_DIR/shrunk.yaml`` (or ``--out``) and
``RUN_DIR/shrink.json`` (every step, sizes, times). Exit codes: 0 written, 1 the run does not
fail again (nothing to shrink), 2 bad RUN_DIR or check name, 3 the stack did not start.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import typer
import yaml

from chaos.scenario.model import Scenario
from chaos.shrink.shrink import ShrinkResult
from chaos.shrink.shrink import shrink as shrink_scenario


def scenario_yaml(s: Scenario, out: Path, header: str = "") -> str:
    """The scenario as YAML that loads back into the same model, its stack path relative to
    ``out``'s folder."""
    data: dict[str, Any] = s.model_dump(mode="json", exclude_defaults=True)
    data["workload"] = s.workload.model_dump(mode="json")  # every workload knob, for the reader
    data["name"] = s.name
    data["stack"] = os.path.relpath(Path(s.stack).resolve(), Path(out).resolve().parent)
    data["seed"] = s.seed
    order = ["name", "description", "stack", "seed", "engine", "variables", "workload", "phases", "checks", "xfail"]
    ordered = {k: data[k] for k in order if k in data}
    ordered.update({k: v for k, v in data.items() if k not in ordered})
    text = yaml.safe_dump(ordered, sort_keys=False, default_flow_style=None, width=100)
    lines = "".join(f"# {h}\n" for h in header.splitlines())
    schema = Path(__file__).resolve().parents[2] / "schemas" / "scenario.schema.json"
    ref = os.path.relpath(schema, Path(out).resolve().parent) if schema.is_file() else "scenario.schema.json"
    return f"# yaml-language-server: $schema={ref}\n" + lines + text


def run_shrink(run_dir: Path, *, check: str | None = None, reruns: int = 3, search_reruns: int = 1,
               budget_s: float = 300.0, runs_at_least: int = 0, backend: str = "local",
               out: Path | None = None, pool=None, say=lambda _m: None) -> tuple[ShrinkResult, Path]:
    """Shrink the scenario of a failing run and write the YAML.

    Args:
        run_dir: the failing run (result.json names its scenario, engine bugs and checks).
        check: the check to keep failing (default: the run's first failed check).
        reruns, search_reruns, budget_s, runs_at_least: see :func:`chaos.shrink.shrink.shrink`.
        out: where the YAML goes (default ``run_dir/shrunk.yaml``).
        pool: a StackPool to run the candidates on (the zoo's); default a new one, closed after.

    Returns:
        ``(result, path of the YAML)``.

    Raises:
        ValueError: bad run dir or check; the run does not fail again (message says which).
        StackError, ConfigError: the stack did not start.
    """
    from chaos.report.writer import ReportError, read_result
    from chaos.runner.run import run_scenario
    from chaos.runner.stacks import StackPool
    from chaos.scenario.loader import load_scenario
    from chaos.stack.base import new_run_id
    from chaos.runner.leaks import restart_dirty

    run_dir = Path(run_dir)
    try:
        result = read_result(run_dir)
    except ReportError as exc:
        raise ValueError(str(exc)) from None
    failed = [c.name for c in result.checks if c.verdict == "failed"]
    target = check or (failed[0] if failed else None)
    if target is None:
        raise ValueError(f"{run_dir}: no check failed in this run; nothing to shrink")
    if target not in [c.name for c in result.checks]:
        raise ValueError(f"{run_dir}: the run has no check {target!r} (it has {[c.name for c in result.checks]})")
    if not result.scenario_path or not Path(result.scenario_path).is_file():
        raise ValueError(f"{run_dir}: the run's scenario file {result.scenario_path!r} is gone")
    scenario = load_scenario(result.scenario_path)
    # each fault's window in the caught run: an `until: end` fault merged into another phase keeps it
    windows = {f.fault_id: f.healed_at - f.applied_at for f in result.faults
               if f.applied_at is not None and f.healed_at is not None and f.healed_at > f.applied_at}
    scenario.engine.bugs = list(result.engine_bugs)
    out = Path(out) if out is not None else run_dir / "shrunk.yaml"
    work = run_dir / "shrink"
    work.mkdir(parents=True, exist_ok=True)
    own_pool = pool is None
    if own_pool:
        pool = StackPool(backend, work / "stacks")
    last_dir: list[Path] = []

    def run_once(cand: Scenario) -> tuple[str, float, str, bool]:
        """One run of ``cand``: (the target check's verdict, seconds, note, an error came)."""
        run_id = new_run_id(cand.name)
        cdir = work / run_id
        t0 = time.monotonic()
        stack = pool.acquire(Path(cand.stack), cand.stack_variables(), say=lambda _m: None)
        # No after_checks (no diagnosis): candidates are judged by their checks only.
        res = run_scenario(cand.model_copy(deep=True), stack, cdir, run_id=run_id, timeout_s=300)
        if res.error or any(f.kind == "kill" for f in res.faults):
            pool.release(Path(cand.stack), res)  # a restarted server: the next run gets a fresh stack
        else:
            # A healed pause leaves the processes running: restart only what still holds locks or
            # sessions (the candidates check one thing, not leaks), not the whole stack.
            restart_dirty(stack, lambda _m: None)
        secs = time.monotonic() - t0
        verdict = next((c.verdict for c in res.checks if c.name == target), "unknown")
        note = res.error.splitlines()[0] if res.error else f"{target} {verdict}"
        for d in last_dir:
            shutil.rmtree(d, ignore_errors=True)
        last_dir[:] = [cdir]
        return verdict, secs, note, res.error is not None

    def fails(cand: Scenario) -> tuple[bool, float, str]:
        verdict, secs, note, error = run_once(cand)
        return verdict == "failed" and not error, secs, note

    def control(cand: Scenario) -> tuple[bool, float, str]:
        """The candidate on the clean engine: anything but a pass counts as failing there."""
        clean = cand.model_copy(deep=True)
        clean.engine.bugs = []
        verdict, secs, note, _error = run_once(clean)
        return verdict != "passed", secs, note

    try:
        res = shrink_scenario(scenario, target, fails, reruns=reruns, search_reruns=search_reruns,
                              budget_s=budget_s, control=control if scenario.engine.bugs else None,
                              windows=windows, runs_at_least=runs_at_least, say=say)
    finally:
        if own_pool:
            pool.close()
    header = (f"shrunk by `kvchaos shrink` from {result.run_id} ({result.scenario}, engine bugs "
              f"{', '.join(result.engine_bugs) or 'none'}): fails {target} in {res.verified} of {res.reruns} reruns\n"
              f"{res.final['requests']} requests, {res.final['phases']} phase(s), {res.final['faults']} fault(s); "
              f"was {res.original['requests']} requests, {res.original['phases']} phase(s)")
    res.scenario.description = (f"Shrunk from {result.scenario} (run {result.run_id}): the smallest scenario "
                                f"found that still fails {target}.")
    out.write_text(scenario_yaml(res.scenario, out, header))
    load_scenario(out)  # it must load as a normal scenario
    (run_dir / "shrink.json").write_text(json.dumps({
        "check": target, "out": str(out), "original": res.original, "final": res.final,
        "verified": res.verified, "reruns": res.reruns, "run_seconds": res.run_seconds, "seconds": res.seconds,
        "budget_spent": res.budget_spent,
        "steps": [{"change": s.change, "accepted": s.accepted, "runs": s.runs, "note": s.note} for s in res.steps],
    }, indent=2) + "\n")
    return res, out


def shrink(
    run_dir: Path = typer.Argument(..., help="a failing run folder, reports/<run-id>"),
    check: str | None = typer.Option(None, "--check", help="the check to keep failing (default: the first failed)"),
    reruns: int = typer.Option(3, "--reruns", min=1, help="the result must fail in this many of this many runs"),
    search_reruns: int = typer.Option(1, "--search-reruns", min=1, help="runs per candidate during the search"),
    budget: float = typer.Option(300.0, "--budget", help="seconds of search (then the best so far is verified)"),
    runs_at_least: int = typer.Option(0, "--runs-at-least", min=0, help="search at least this many times the "
                                      "first run's own seconds (for slow runs: a restart, a reconnect wait)"),
    out: Path | None = typer.Option(None, "--out", help="where the YAML goes (default RUN_DIR/shrunk.yaml)"),
    backend: str = typer.Option("local", "--backend", "-b", envvar="KVCHAOS_BACKEND", help="local or compose"),
) -> None:
    """Write the smallest scenario that still fails the run's check (delta debugging over
    phases, faults, fault windows, requests, families, prefix lengths, concurrency), each
    candidate run on one reused stack; the result fails in RERUNS of RERUNS runs."""
    from chaos.stack.base import StackError
    from chaos.yamlsource import ConfigError

    t0 = time.monotonic()
    try:
        res, path = run_shrink(run_dir, check=check, reruns=reruns, search_reruns=search_reruns, budget_s=budget,
                               runs_at_least=runs_at_least, backend=backend, out=out,
                               say=lambda m: typer.echo(m, err=True))
    except (StackError, ConfigError) as exc:
        print(f"error: stack: {exc}", file=sys.stderr)
        raise typer.Exit(3) from None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(1 if "does not fail" in str(exc) else 2) from None
    typer.echo(f"shrunk: {res.original} -> {res.final}; fails {res.verified} of {res.reruns} reruns; "
               f"one run {res.run_seconds:.1f}s; shrink wall time {time.monotonic() - t0:.1f}s")
    typer.echo(str(path))
    raise typer.Exit(0 if res.verified == res.reruns else 1)
