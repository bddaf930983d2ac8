"""The ``kvchaos`` command line.

Exit codes (DESIGN.md): 0 all checks passed, 1 a check failed, 2 the scenario or stack file is
invalid, 3 infrastructure error (a stack did not start), 4 inconclusive, 5 passed but a window
not proven (``trigger: none``).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from chaos.proxy.real import PROXY_OPTION_HELP
from chaos.yamlsource import ConfigError

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_INFRA, EXIT_INCONCLUSIVE = 0, 1, 2, 3, 4

app = typer.Typer(help="kvchaos: fault-injection testing for LLM serving stacks that reuse KV cache.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
stack_app = typer.Typer(help="Bring a stack file's services up or down as local processes.",
                        no_args_is_help=True)
app.add_typer(stack_app, name="stack")


@app.callback()
def _command_starts(ctx: typer.Context) -> None:
    """Before any command: the entry point's start-up mode for signals ends here (chaos/entry.py),
    except for `run`, which ends it after its own imports and the validation."""
    if ctx.invoked_subcommand != "run":
        from chaos import interrupts

        interrupts.end_startup()


def _add_layer_commands() -> None:
    """Sub-commands of the other layers; each module keeps heavy imports (torch) inside its
    commands so that `kvchaos --help` stays fast."""
    from chaos.engine.cli import app as engine_app
    from chaos.proxy.cli import app as proxy_app
    from chaos.scenario.cli import findings, list_scenarios, schema, validate

    app.command("validate")(validate)
    app.command("schema")(schema)
    app.command("list")(list_scenarios)
    app.command("findings")(findings)
    from chaos.zoo import zoo

    app.command("zoo")(zoo)
    from chaos.explore.cli import explore

    app.command("explore")(explore)
    from chaos.coverage import docs_command
    from chaos.zoo import coverage_run

    coverage_app = typer.Typer(help="Engine path coverage under the catalogue (docs/coverage.md).",
                               no_args_is_help=True)
    coverage_app.command("run")(coverage_run)
    coverage_app.command("docs")(docs_command)
    app.add_typer(coverage_app, name="coverage")
    from chaos.diagnose.cli import diagnose
    from chaos.shrink.cli import shrink

    app.command("diagnose")(diagnose)
    app.command("shrink")(shrink)
    app.add_typer(proxy_app, name="proxy")
    app.add_typer(engine_app, name="engine")
    from chaos.vllm.cli import app as vllm_app

    app.add_typer(vllm_app, name="vllm")


_add_layer_commands()

console = Console(stderr=True, log_path=False)
out = Console(width=120)


def fail_config(exc: ConfigError) -> None:
    """Print a ConfigError (every problem, file:line: field: message) and exit 2."""
    for line in exc.problems:
        print(f"error: {line}", file=sys.stderr)
    raise typer.Exit(EXIT_INVALID)


def _select_proxy(proxy: str | None) -> None:
    """``--proxy``: set the stack variable KVCHAOS_PROXY, or exit 2 for a bad value."""
    from chaos.proxy.real import use_proxy

    try:
        use_proxy(proxy)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_INVALID) from None


@stack_app.command("up")
def stack_up(file: Path = typer.Argument(..., help="stack file (compose format with x-kvchaos)"),
             service: list[str] = typer.Option(None, "--service", "-s",
                                               help="start only this service and its dependencies "
                                                    "(repeatable; local backend)"),
             backend: str = typer.Option("local", "--backend", "-b", envvar="KVCHAOS_BACKEND",
                                         help="local (processes) or compose (Docker containers)"),
             proxy: str | None = typer.Option(None, "--proxy", envvar="KVCHAOS_PROXY", help=PROXY_OPTION_HELP),
             ) -> None:
    """Start every service of FILE (local processes or, with --backend compose, a compose
    project), wait until healthy, and leave it running for `kvchaos stack status|down FILE`."""
    from chaos.stack.base import StackError
    from chaos.stack.detached import detached_state_dir

    if backend not in ("local", "compose"):
        console.print(f"error: --backend must be local or compose, not {backend!r}")
        raise typer.Exit(EXIT_INVALID)
    if service and backend == "compose":
        console.print("error: --service works with the local backend only")
        raise typer.Exit(EXIT_INVALID)
    _select_proxy(proxy)
    run_dir = detached_state_dir(file)
    if (run_dir / "state.json").exists():
        console.print(f"stack {file} is already up (state in {run_dir}); `kvchaos stack down {file}` first")
        raise typer.Exit(EXIT_INFRA)
    try:
        if backend == "compose":
            from chaos.stack.compose import ComposeStack

            stack = ComposeStack(file, run_dir=run_dir)
        else:
            from chaos.stack.local import LocalStack

            stack = LocalStack(file, run_dir=run_dir)
            if service:
                stack.spec.with_dependencies(service)
    except ConfigError as exc:
        fail_config(exc)
    except StackError as exc:
        console.print(f"[red]no {backend} backend:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_INFRA)
    from chaos import interrupts

    try:
        with interrupts.handling(), console.status(f"starting {file} ..."):
            interrupts.set_stage("stack start-up")
            if service:
                stack.up(service)
            else:
                stack.up()
    except interrupts.RunInterrupted as exc:  # up() brought down what it had started
        with interrupts.deferred():
            stack.down()
        console.print(f"[red]interrupted[/red] ({exc.describe()}): the stack is down", highlight=False)
        raise typer.Exit(exc.exit_code) from None
    except StackError as exc:
        console.print(f"[red]stack did not start:[/red] {exc}", highlight=False)
        stack.down()  # a compose project half up, or processes that did start
        raise typer.Exit(EXIT_INFRA)
    _print_status(stack)
    console.print(f"logs: {stack.log_dir}")


@stack_app.command("down")
def stack_down(file: Path = typer.Argument(..., help="stack file given to `stack up`")) -> None:
    """Stop every service of a stack started with `kvchaos stack up FILE` (either backend)."""
    from chaos.stack.base import StackError
    from chaos.stack.detached import attach_detached, detached_state_dir

    run_dir = detached_state_dir(file)
    if not (run_dir / "state.json").exists():
        console.print(f"stack {file} is not up")
        return
    try:
        stack = attach_detached(run_dir)
    except ConfigError as exc:
        fail_config(exc)
    except StackError as exc:
        console.print(f"[red]cannot reach the stack:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_INFRA)
    stack.down()
    console.print(f"stack {file} is down")


@stack_app.command("status")
def stack_status(file: Path = typer.Argument(..., help="stack file given to `stack up`"),
                 as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Show the services of a stack started with `kvchaos stack up FILE` (either backend)."""
    from chaos.stack.base import StackError
    from chaos.stack.detached import attach_detached, detached_state_dir

    run_dir = detached_state_dir(file)
    if not (run_dir / "state.json").exists():
        console.print(f"stack {file} is not up")
        raise typer.Exit(EXIT_INFRA)
    try:
        stack = attach_detached(run_dir)
    except ConfigError as exc:
        fail_config(exc)
    except StackError as exc:
        console.print(f"[red]cannot reach the stack:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_INFRA)
    if as_json:
        st = stack.status()
        out.print_json(json.dumps({n: {"state": s.state, "pid": s.pid} for n, s in st.items()}))
        return
    _print_status(stack)


def _print_status(stack) -> None:
    table = Table(title=f"stack {stack.spec.path}")
    table.add_column("service")
    table.add_column("state")
    table.add_column("pid")
    for name, s in stack.status().items():
        table.add_row(name, s.state, str(s.pid or ""))
    out.print(table)
    ports = {k: v for k, v in sorted(stack.env.items()) if k.endswith("_PORT")}
    if ports:
        out.print("ports: " + ", ".join(f"{k}={v}" for k, v in ports.items()), highlight=False)


@app.command("run")
def run_cmd(
    scenarios: list[Path] = typer.Argument(..., help="scenario files or folders of them"),
    backend: str = typer.Option("local", "--backend", "-b", envvar="KVCHAOS_BACKEND",
                                help="local (processes, no Docker) or compose (docker compose)"),
    seed: int | None = typer.Option(None, "--seed", help="override every scenario's seed"),
    keep_stack: bool = typer.Option(False, "--keep-stack", help="leave the stacks running at the end"),
    report_dir: Path = typer.Option(Path("reports"), "--report-dir", help="parent folder of run reports"),
    bug: list[str] = typer.Option(None, "--bug", help="plant this engine bug in every scenario (repeatable; "
                                  "the stack's set: `kvchaos engine serve --help` on the reference "
                                  "stack, chaos/vllm/bugs.py on compose/vllm-cpu.yml)"),
    timeout: float = typer.Option(600.0, "--timeout", help="per-scenario deadline for the phases (s)"),
    stack: Path | None = typer.Option(None, "--stack", help="run every scenario on this stack file "
                                      "instead of its own (e.g. compose/vllm-lmcache.yml on a GPU host)"),
    proxy: str | None = typer.Option(None, "--proxy", envvar="KVCHAOS_PROXY", help=PROXY_OPTION_HELP),
    numerics: str | None = typer.Option(None, "--numerics", help="run every scenario's engine with these "
                                        "numerics: exact | batch-dependent (reference engine)"),
    equivalence: str | None = typer.Option(None, "--equivalence", help="recompute_equivalence mode for "
                                           "every scenario: exact | tolerant (engines that are not bit-exact)"),
    diagnose: int = typer.Option(3, "--diagnose", envvar="KVCHAOS_DIAGNOSE", min=0,
                                 help="diagnose the first N failing requests of each run (0: off)"),
    diagnose_budget: float = typer.Option(60.0, "--diagnose-budget", envvar="KVCHAOS_DIAGNOSE_BUDGET_S",
                                          help="seconds of diagnosis per run, at most"),
    jobs: str = typer.Option("1", "--jobs", "-j", envvar="KVCHAOS_JOBS",
                             help="scenarios run at once, each worker on stacks of its own: a number, "
                                  "or auto (from cores and memory; README \"Parallel runs\")"),
) -> None:
    """Run chaos scenarios against their stacks and check the invariants.

    Exit codes: 0 all checks passed, 1 a check failed, 2 a scenario or stack file is invalid,
    3 infrastructure error (a stack did not start), 4 inconclusive (a fault never bit, a window
    not reached), 5 passed with a window not proven (``trigger: none``).
    """
    from chaos import interrupts

    # From the first moment: a signal during the imports, the validation or the stack start-up
    # is handled too (the entry point holds signals from its first instruction; without it, from
    # here), and gets a report.
    try:
        with interrupts.handling():
            interrupts.hold_startup()
            try:
                _run(scenarios, backend, seed, keep_stack, report_dir, bug, timeout, stack, proxy=proxy,
                     numerics=numerics, equivalence=equivalence, diagnose=diagnose,
                     diagnose_budget=diagnose_budget, jobs=jobs)
            except interrupts.RunInterrupted as exc:
                # Already reported by _run when the suite had started; the exit code says which.
                if exc.suite_dir is None:
                    console.print(f"[red]interrupted[/red] ({exc.describe()})", highlight=False)
                raise typer.Exit(exc.exit_code) from None
    finally:
        interrupts.exit_on_signal()  # the run is over: a signal now only sets the exit code


def _run(scenarios: list[Path], backend: str, seed: int | None, keep_stack: bool, report_dir: Path,
         bug: list[str] | None, timeout: float, stack: Path | None, *, proxy: str | None,
         numerics: str | None, equivalence: str | None, diagnose: int, diagnose_budget: float,
         jobs: str = "1") -> None:
    from chaos import interrupts
    loaded: list = []
    stopped: interrupts.RunInterrupted | None = None
    try:
        try:  # start-up: signals held (interrupts.hold_startup) until the files are validated
            from chaos.campaign import parse_jobs, run_campaign
            from chaos.diagnose.hook import diagnose_after_checks
            from chaos.report.suite import build_suite, print_suite, suite_exit_code
            from chaos.runner.suite import SuiteOptions, interrupted_before_start

            opts = SuiteOptions(backend=backend, report_dir=report_dir, keep_stack=keep_stack, seed=seed,
                                engine_bugs=list(bug) if bug else None, timeout_s=timeout,
                                engine_numerics=numerics, equivalence_mode=equivalence,
                                after_checks=diagnose_after_checks)  # why requests failed (chaos/diagnose)
            try:
                workers = parse_jobs(jobs)
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                raise typer.Exit(EXIT_INVALID) from None
            loaded = _validate_for_run(scenarios, backend, stack, bug, proxy=proxy, numerics=numerics,
                                       equivalence=equivalence, diagnose=diagnose, diagnose_budget=diagnose_budget)
        finally:
            # Raises RunInterrupted (stage "start-up") when a signal came; after it, the stage is
            # "suite start" until the suite names its own (never none: a report always says where).
            interrupts.end_startup(then=interrupts.SUITE_START)
        # Workers write their own lines to stderr: no status line redrawn over them.
        with console.status("starting") if workers == 1 else contextlib.nullcontext() as status:
            def say(msg: str) -> None:
                if status is not None:
                    status.update(msg)
                console.log(msg, highlight=False)

            results, suite_dir = run_campaign(loaded, opts, workers, say)
    except interrupts.RunInterrupted as exc:
        stopped = exc
        if exc.suite_dir is None:  # before the suite started: every scenario gets its report
            with interrupts.deferred():
                exc.results, exc.suite_dir = interrupted_before_start(loaded, opts, exc)
            console.print(f"[red]interrupted[/red] ({exc.describe()}): nothing had started, reports written",
                          highlight=False)
        else:
            console.print(f"[red]interrupted[/red] ({exc.describe()}): faults healed, stacks "
                          f"{'left up (--keep-stack)' if keep_stack else 'stopped'}, reports written",
                          highlight=False)
        results, suite_dir = exc.results, exc.suite_dir
    from chaos.report.model import UNPROVEN, InterruptInfo

    info = None if stopped is None else InterruptInfo(signal=stopped.signal_name, exit_code=stopped.exit_code,
                                                      stage=stopped.stage)
    with interrupts.deferred():
        suite = build_suite(suite_dir.name, results, report_dir, info)
        print_suite(suite, Console(width=160))
        for r in results:
            bad = [c for c in r.checks if c.verdict != "passed"]
            for c in bad:
                out.print(f"{r.scenario}: {c.name} {c.verdict}: {c.summary}", highlight=False)
            if r.verdict == UNPROVEN:
                for c in r.checks:
                    if c.name == "evidence":
                        out.print(f"{r.scenario}: {UNPROVEN}: {c.summary}", highlight=False)
            if r.interrupted:
                out.print(f"{r.scenario}: interrupted by {r.interrupted.describe()}", highlight=False)
            if r.error:
                out.print(f"{r.scenario}: error: {r.error.splitlines()[0]}", highlight=False)
            out.print(f"report: {report_dir / r.run_id / 'report.html'}", highlight=False)
        out.print(f"suite: {suite_dir}", highlight=False)
    if stopped is not None:
        raise typer.Exit(stopped.exit_code)
    raise typer.Exit(suite_exit_code(results))


def _validate_for_run(scenarios: list[Path], backend: str, stack: Path | None, bug: list[str] | None, *,
                      proxy: str | None, numerics: str | None, equivalence: str | None, diagnose: int,
                      diagnose_budget: float) -> list:
    """`kvchaos run`'s options and files checked: the validated scenarios. Exit 2 (typer.Exit)
    for a bad option or an invalid file, every problem and warning printed."""
    import os

    from chaos.runner.suite import load_and_validate
    from chaos.scenario.loader import discover_scenarios

    if backend not in ("local", "compose"):
        print(f"error: --backend must be local or compose, not {backend!r}", file=sys.stderr)
        raise typer.Exit(EXIT_INVALID)
    _select_proxy(proxy)
    if numerics not in (None, "exact", "batch-dependent") or equivalence not in (None, "exact", "tolerant"):
        print("error: --numerics must be exact or batch-dependent, --equivalence exact or tolerant",
              file=sys.stderr)
        raise typer.Exit(EXIT_INVALID)
    os.environ.update(KVCHAOS_DIAGNOSE=str(diagnose), KVCHAOS_DIAGNOSE_BUDGET_S=str(diagnose_budget))  # chaos/diagnose/hook.py
    warnings: list[str] = []
    try:
        paths = [p for root in scenarios for p in discover_scenarios(root)]
        if not paths:
            print(f"error: no scenario files in {', '.join(map(str, scenarios))}", file=sys.stderr)
            raise typer.Exit(EXIT_INVALID)
        loaded = load_and_validate(paths, stack, bugs=list(bug) if bug else None, numerics=numerics,
                                   equivalence=equivalence, warnings=warnings,
                                   require_commands=backend == "local")
    except ConfigError as exc:
        for line in warnings:
            print(f"warning: {line}", file=sys.stderr)
        fail_config(exc)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    if bug:
        from chaos.zoo import bug_set

        for stack_file in sorted({str(s.stack) for s in loaded}):
            known, _map = bug_set(Path(stack_file))
            unknown = [b for b in bug if b not in known]
            if unknown:
                print(f"error: --bug {', '.join(unknown)}: not a planted bug of {stack_file}; its bugs: "
                      f"{', '.join(sorted(known))}", file=sys.stderr)
                raise typer.Exit(EXIT_INVALID)
    return loaded


@app.command("report")
def report_cmd(run_dir: Path = typer.Argument(..., help="a run folder, reports/<run-id>")) -> None:
    """Re-render a run's junit.xml and report.html from its result.json and history.jsonl."""
    from chaos.report.cli import report

    raise typer.Exit(report(run_dir))


@app.command("cleanup")
def cleanup_cmd(force: list[str] = typer.Option(None, "--force", metavar="RUN_ID",
                                                help="undo this run's journal even though its runner still "
                                                     "runs (or it is a stack left up by `kvchaos stack up`); "
                                                     "repeatable")) -> None:
    """Undo what killed runs left behind (toxics, paused or orphaned processes, mounts, ballast
    files, compose projects), from the journals in the state directory. Runs whose runner still
    runs, and stacks left up by `kvchaos stack up`, are skipped and named; port claim files of
    ended processes are deleted (chaos/stack/ports.py); exit 1 when something could not be
    undone."""
    from chaos.cleanup import cleanup
    from chaos.stack.ports import claims_dir, remove_stale

    rep = cleanup(force=force or ())
    removed, _kept = remove_stale()  # files only: the claims ended with their processes
    if removed:
        out.print(f"port claims: deleted {removed} stale file{'s' if removed != 1 else ''} (no process holds "
                  f"{'them' if removed != 1 else 'it'}) in {claims_dir()}", highlight=False)
    for line in rep.undone:
        out.print(line, highlight=False)
    for line in rep.skipped:
        out.print(f"skipped {line}", highlight=False)
    for line in rep.errors:
        print(f"error: {line}", file=sys.stderr)
    if not rep.undone and not rep.errors and not rep.skipped:
        out.print("nothing to clean up")
    raise typer.Exit(1 if rep.errors else 0)


@app.command("probe")
def probe_cmd(url: str = typer.Argument(..., help="http(s)://host:port/path or tcp://host:port"),
              timeout: float = typer.Option(2.0, help="seconds")) -> None:
    """Health probe for stack files: exit 0 when URL answers (HTTP 2xx, or TCP connect)."""
    from chaos.stack.probe import probe

    try:
        ok, detail = probe(url, timeout_s=timeout)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_INVALID)
    print(detail)
    raise typer.Exit(0 if ok else 1)


@app.command("doctor")
def doctor_cmd() -> None:
    """Show which optional parts are present (Docker, compose, redis-server, lmcache, torch,
    tmpfs mounts) and what to do about each missing one. Always exits 0."""
    from chaos.doctor import run_checks

    table = Table(title="kvchaos doctor")
    for col in ("part", "status", "detail", "needed for", "what to do"):
        table.add_column(col)
    for f in run_checks():
        table.add_row(f.name, "ok" if f.ok else "MISSING", f.detail, f.needed_for, f.fix)
    Console(width=200).print(table)


def main() -> None:
    """Console-script entry point."""
    from chaos.interrupts import dump_stacks_on_sigusr1

    dump_stacks_on_sigusr1()
    app()


if __name__ == "__main__":
    main()
