"""A suite: several scenario files run in order, sharing stacks, with one summary.

    validate every scenario and its stack (nothing starts if any is invalid: exit 2)
      └─> for each scenario: StackPool.acquire (start or reset) ─> run_scenario ─> report
            └─> suite.json + junit.xml + summary table; stacks down (unless --keep-stack)

SIGINT/SIGTERM at any point of it (chaos/interrupts.py): the scenario under way gets its
report (verdict ``interrupted``, also when the signal came while its stack started), the stacks
go down (a second signal is held until they are), the suite report is written, and
RunInterrupted leaves with the results.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chaos import interrupts
from chaos.interrupts import RunInterrupted
from chaos.report.model import InterruptInfo, RunResult
from chaos.report.result import build_result
from chaos.report.suite import write_suite
from chaos.report.writer import write_report
from chaos.runner.run import run_scenario
from chaos.runner.stacks import StackPool
from chaos.scenario.loader import check_scenario, override
from chaos.scenario.model import Scenario
from chaos.stack.base import StackError, new_run_id
from chaos.yamlsource import ConfigError


@dataclass
class SuiteOptions:
    """How to run a suite.

    Attributes:
        backend: "local" (processes) or "compose" (docker compose).
        report_dir: parent of the run folders (``reports/``).
        keep_stack: leave stacks up at the end.
        seed: override every scenario's seed.
        engine_bugs: plant these engine bugs in every scenario (the bug zoo).
        engine_numerics: run every scenario's engine with these numerics (``batch-dependent``:
            the reference engine's non-batch-invariant mode).
        equivalence_mode: set every scenario's ``recompute_equivalence.mode`` (``tolerant``).
        timeout_s: per-scenario deadline for the phases.
    """

    backend: str = "local"
    report_dir: Path = Path("reports")
    keep_stack: bool = False
    seed: int | None = None
    engine_bugs: list[str] | None = None
    engine_numerics: str | None = None
    equivalence_mode: str | None = None
    timeout_s: float | None = 600.0
    run_id_prefix: str = ""
    extra: dict = field(default_factory=dict)


def load_and_validate(paths: list[Path], stack: Path | None = None, *,
                      warnings: list[str] | None = None, require_commands: bool = True,
                      **overrides: object) -> list[Scenario]:
    """Load every scenario and check each against its stack file (links, services, what its
    checks need, the capabilities its faults, checks, variables and engine options need), every
    problem of a file in one pass (chaos.scenario.loader.check_scenario).

    Args:
        paths: scenario files.
        stack: run every scenario on this stack file instead of its own (e.g. the GPU stack).
        warnings: when given, the files' warnings (``file:line: ...``) are appended to it.
        require_commands: every stack service needs a ``command`` (the local backend runs it).
        overrides: :func:`override`'s keywords (bugs, numerics, equivalence), applied before the
            checks against the stack, so that what they need is checked too.

    Raises:
        ConfigError: the first invalid file, with every problem of it listed.
    """
    scenarios = []
    for path in paths:
        check = check_scenario(path, stack=stack, require_commands=require_commands, overrides=overrides)
        if warnings is not None:
            warnings.extend(check.warning_lines())
        if not check.ok:
            raise check.error()
        assert check.scenario is not None
        scenarios.append(check.scenario)
    return scenarios


def infra_error_result(scenario: Scenario, run_id: str, run_dir: Path, error: str) -> RunResult:
    """A result for a scenario that could not run (stack did not start): exit code 3, with a
    report written so nothing is lost."""
    return _result_without_run(scenario, run_id, run_dir, error=error)


def interrupted_result(scenario: Scenario, run_id: str, run_dir: Path, exc: RunInterrupted) -> RunResult:
    """A result for a scenario a signal stopped before the runner wrote one (during stack
    start-up, a reset, or the first instants of the run): verdict ``interrupted``, exit code
    128 + the signal, with whatever history the run had written; the report is written."""
    history: list[dict] = []
    try:
        text = (run_dir / "history.jsonl").read_text(encoding="utf-8")
    except OSError:
        text = ""
    for line in text.splitlines():
        try:
            history.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line
    info = InterruptInfo(signal=exc.signal_name, exit_code=exc.exit_code, stage=exc.stage)
    return _result_without_run(scenario, run_id, run_dir, history=history, interrupted=info)


def interrupted_before_start(scenarios: list[Scenario], opts: SuiteOptions,
                             exc: RunInterrupted) -> tuple[list[RunResult], Path]:
    """The reports of a suite a signal stopped before it started (while `kvchaos run` imported
    its modules or validated the files): every scenario gets a result with verdict
    ``interrupted`` (nothing ran; stage ``exc.stage``, "start-up" when unnamed) and the suite
    report is written, as :func:`run_suite` writes them.

    Args:
        scenarios: the scenarios validated so far (may be empty: the suite report still says
            interrupted).
        opts: the suite's options (report_dir, run_id_prefix).
        exc: the signal; its stage is set to "start-up" when it has none.

    Returns:
        ``(results, suite_dir)`` like :func:`run_suite`.

    Raises:
        OSError: a report cannot be written.
    """
    if exc.stage is None:
        exc.stage = interrupts.STARTUP
    suite_id = new_run_id(opts.run_id_prefix + "suite")
    suite_dir = opts.report_dir / suite_id
    results = []
    for scenario in scenarios:
        run_id = new_run_id(opts.run_id_prefix + scenario.name)
        run_dir = opts.report_dir / run_id
        results.append(interrupted_result(scenario, run_id, run_dir, exc))
    info = InterruptInfo(signal=exc.signal_name, exit_code=exc.exit_code, stage=exc.stage)
    write_suite(suite_dir, suite_id, results, interrupted=info)
    return results, suite_dir


def _result_without_run(scenario: Scenario, run_id: str, run_dir: Path, *, history: list | None = None,
                        error: str | None = None, interrupted: InterruptInfo | None = None) -> RunResult:
    history = history or []
    result = build_result(run_id=run_id, scenario=scenario.name, history=history, checks=[], seed=scenario.seed,
                          description=scenario.description, scenario_path=str(scenario.source),
                          stack=str(scenario.stack), xfail=scenario.xfail, error=error,
                          engine_bugs=scenario.engine.bugs, interrupted=interrupted)
    with interrupts.deferred():
        write_report(run_dir, result, history)
    return result


def run_suite(scenarios: list[Scenario], opts: SuiteOptions,
              say: Callable[[str], None] = lambda _m: None) -> tuple[list[RunResult], Path]:
    """Run validated scenarios in order, reusing one stack per stack file.

    Returns:
        ``(results, suite_dir)``; each run's report is in ``report_dir/<run_id>/``, the suite's
        ``suite.json``/``junit.xml`` in ``report_dir/<suite_id>/``.

    Raises:
        RunInterrupted: SIGINT or SIGTERM at any point (stack start-up, a phase, checks, report,
            teardown): after the current scenario healed its faults and wrote its report
            (verdict ``interrupted``), the stacks were brought down and the suite report was
            written; ``.results`` holds the results, ``.suite_dir`` the suite's folder.
    """
    suite_id = new_run_id(opts.run_id_prefix + "suite")
    suite_dir = opts.report_dir / suite_id
    pool = StackPool(opts.backend, suite_dir / "stacks", keep=opts.keep_stack)
    results: list[RunResult] = []
    stop: RunInterrupted | None = None
    with interrupts.handling():
        current: dict | None = None  # the scenario under way, until its result is in `results`
        try:
            for scenario in scenarios:
                if opts.seed is not None:
                    scenario.seed = opts.seed
                override(scenario, bugs=opts.engine_bugs, numerics=opts.engine_numerics,
                         equivalence=opts.equivalence_mode)
                run_id = new_run_id(opts.run_id_prefix + scenario.name)
                run_dir = opts.report_dir / run_id
                current = {"scenario": scenario, "run_id": run_id, "run_dir": run_dir, "result": None}
                say(f"[{scenario.name}] preparing the stack")
                t0 = time.monotonic()
                try:
                    stack = pool.acquire(Path(scenario.stack), scenario.stack_variables(), say=say)
                except (StackError, ConfigError) as exc:
                    results.append(infra_error_result(scenario, run_id, run_dir, f"stack: {exc}"))
                    current = None
                    continue
                setup_s = time.monotonic() - t0
                current["result"] = run_scenario(scenario, stack, run_dir, run_id=run_id, timeout_s=opts.timeout_s,
                                                 progress=lambda m, n=scenario.name: say(f"[{n}] {m}"))
                result = current["result"]
                with interrupts.deferred():
                    pool.release(Path(scenario.stack), result)
                    result.durations.stack_up_s = setup_s
                    (run_dir / "result.json").write_text(result.model_dump_json(indent=2))
                    results.append(result)
                    current = None
        except KeyboardInterrupt as exc:
            stop = interrupts.as_interrupt(exc)
            if current is not None:
                result = current["result"] or stop.result or interrupted_result(
                    current["scenario"], current["run_id"], current["run_dir"], stop)
                if result not in results:
                    results.append(result)
        finally:
            try:
                with interrupts.stage("teardown"):
                    say("stopping stacks" if not opts.keep_stack else "leaving stacks up (--keep-stack)")
                    pool.close()
            except KeyboardInterrupt as exc:
                stop = stop or interrupts.as_interrupt(exc)
            try:
                with interrupts.deferred():
                    info = None if stop is None else InterruptInfo(
                        signal=stop.signal_name, exit_code=stop.exit_code, stage=stop.stage)
                    if results or stop is not None:
                        write_suite(suite_dir, suite_id, results, interrupted=info)
            except KeyboardInterrupt as exc:
                stop = stop or interrupts.as_interrupt(exc)
    if stop is not None:
        stop.suite_dir = suite_dir
        stop.results = results
        raise stop
    return results, suite_dir
