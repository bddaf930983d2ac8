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
from chaos.runner.run import AfterChecks, run_scenario
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
        after_checks: handed to every run (chaos/runner/run.py ``AfterChecks``; ``kvchaos run``
            hands the diagnosis, chaos/diagnose/hook.py); None: nothing after the checks.
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
    after_checks: AfterChecks | None = None


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
                          stack=str(scenario.stack), xfail=scenario.expected_failure, error=error,
                          engine_bugs=scenario.engine.bugs, interrupted=interrupted)
    with interrupts.deferred():
        write_report(run_dir, result, history)
    return result


def prepare_run(scenario: Scenario, opts: SuiteOptions) -> tuple[str, Path]:
    """Apply the suite's overrides (seed, engine bugs, numerics, equivalence) to ``scenario``
    in place and name its run.

    Returns:
        ``(run_id, run_dir)``: a new unique run id and ``opts.report_dir / run_id``.
    """
    if opts.seed is not None:
        scenario.seed = opts.seed
    override(scenario, bugs=opts.engine_bugs, numerics=opts.engine_numerics,
             equivalence=opts.equivalence_mode)
    run_id = new_run_id(opts.run_id_prefix + scenario.name)
    return run_id, opts.report_dir / run_id


def run_in_pool(scenario: Scenario, pool: StackPool, opts: SuiteOptions, run_id: str, run_dir: Path,
                say: Callable[[str], None], box: dict, timeout_s: float | None = None) -> RunResult:
    """Run one prepared scenario (:func:`prepare_run`) on its stack of ``pool`` (started,
    restarted or reset by :meth:`StackPool.acquire`), tell the pool how it ended, and write its
    ``result.json``. A stack that does not start gives an infrastructure-error result (exit 3,
    report written).

    Args:
        box: the caller's record of the run under way; ``box["result"]`` is set as soon as
            the runner returned, so that after a signal :func:`result_after_interrupt` finds it.
        timeout_s: the run's deadline for its phases; None: ``opts.timeout_s``.

    Returns:
        the run's RunResult.

    Raises:
        RunInterrupted: SIGINT or SIGTERM meanwhile (the report is written, see run_scenario).
    """
    say(f"[{scenario.name}] preparing the stack")
    t0 = time.monotonic()
    try:
        stack = pool.acquire(Path(scenario.stack), scenario.stack_variables(), say=say)
    except (StackError, ConfigError) as exc:
        box["result"] = infra_error_result(scenario, run_id, run_dir, f"stack: {exc}")
        return box["result"]
    setup_s = time.monotonic() - t0
    box["result"] = run_scenario(scenario, stack, run_dir, run_id=run_id,
                                 timeout_s=opts.timeout_s if timeout_s is None else timeout_s,
                                 progress=lambda m, n=scenario.name: say(f"[{n}] {m}"),
                                 after_checks=opts.after_checks)
    result = box["result"]
    with interrupts.deferred():
        pool.release(Path(scenario.stack), result)
        result.durations.stack_up_s = setup_s
        (run_dir / "result.json").write_text(result.model_dump_json(indent=2))
    return result


def result_after_interrupt(box: dict, stop: RunInterrupted) -> RunResult:
    """The result of the run a signal stopped: the runner's own (its report says
    ``interrupted``, or it had finished), else a new ``interrupted`` result with the history
    the run had written (the signal came during the stack's start-up or reset).

    Args:
        box: ``{"scenario", "run_id", "run_dir", "result"}`` as :func:`run_in_pool` filled it.
    """
    return box["result"] or stop.result or interrupted_result(box["scenario"], box["run_id"], box["run_dir"], stop)


def close_pool(pool: StackPool, say: Callable[[str], None], stop: RunInterrupted | None) -> RunInterrupted | None:
    """Bring the pool's stacks down (unless it keeps them, ``--keep-stack``) in the stage
    "teardown", with a second signal held until they are down. What a stack's teardown could
    not undo (a container, a mounted filesystem L2) is written to stderr, one ``kvchaos: error:``
    line naming it and ``kvchaos cleanup``, which undoes it from the journal.

    Returns:
        the signal that stopped the suite: ``stop``, else one that came during the teardown.
    """
    try:
        with interrupts.stage("teardown"):
            try:
                say("stopping stacks" if not pool.keep else "leaving stacks up (--keep-stack)")
            finally:
                pool.close()
    except KeyboardInterrupt as exc:
        stop = stop or interrupts.as_interrupt(exc)
    except StackError as exc:  # never silent: the journal keeps it for `kvchaos cleanup`
        import sys

        try:
            print(f"kvchaos: error: {exc}", file=sys.stderr, flush=True)
        except OSError:  # stderr gone (its reader died)
            pass
    return stop


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
                interrupts.set_stage(f"preparing {scenario.name}")
                with interrupts.deferred():  # a signal here still leaves this scenario's report
                    run_id, run_dir = prepare_run(scenario, opts)
                    current = {"scenario": scenario, "run_id": run_id, "run_dir": run_dir, "result": None}
                results.append(run_in_pool(scenario, pool, opts, run_id, run_dir, say, current))
                current = None
        except KeyboardInterrupt as exc:
            stop = interrupts.as_interrupt(exc)
            if current is not None:
                result = result_after_interrupt(current, stop)
                if result not in results:
                    results.append(result)
        finally:
            stop = close_pool(pool, say, stop)
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
