"""A suite: several scenario files run in order, sharing stacks, with one summary.

    validate every scenario and its stack (nothing starts if any is invalid: exit 2)
      └─> for each scenario: StackPool.acquire (start or reset) ─> run_scenario ─> report
            └─> suite.json + junit.xml + summary table; stacks down (unless --keep-stack)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chaos.report.model import RunResult
from chaos.report.result import build_result
from chaos.report.suite import write_suite
from chaos.report.writer import write_report
from chaos.runner.run import run_scenario
from chaos.runner.stacks import StackPool
from chaos.scenario.loader import load_scenario, validate_against_stack
from chaos.scenario.model import Scenario
from chaos.stack.base import StackError, new_run_id
from chaos.stack.spec import load_stack
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
        timeout_s: per-scenario deadline for the phases.
    """

    backend: str = "local"
    report_dir: Path = Path("reports")
    keep_stack: bool = False
    seed: int | None = None
    engine_bugs: list[str] | None = None
    timeout_s: float | None = 600.0
    run_id_prefix: str = ""
    extra: dict = field(default_factory=dict)


def load_and_validate(paths: list[Path], stack: Path | None = None) -> list[Scenario]:
    """Load every scenario and check each against its stack file (links, services).

    Args:
        paths: scenario files.
        stack: run every scenario on this stack file instead of its own (e.g. the GPU stack).

    Raises:
        ConfigError: the first invalid file, with every problem of it listed.
    """
    scenarios = []
    stacks: dict[Path, tuple[set[str], set[str], dict[str, str | None], object]] = {}
    if stack is not None and not Path(stack).is_file():
        raise ConfigError(str(stack), None, None, "stack file not found (--stack)")
    for path in paths:
        scenario = load_scenario(path)
        if stack is not None:
            scenario.stack = Path(stack).resolve()
        key = Path(scenario.stack).resolve()
        if key not in stacks:
            spec = load_stack(key, allocate_ports=False, run_dir=Path("/nonexistent"))
            urls = {"engine_url": spec.settings.engine_url, "recompute_url": spec.settings.recompute_url}
            stacks[key] = (set(spec.settings.links), set(spec.services), urls, spec.settings)
        links, services, urls, settings = stacks[key]
        validate_against_stack(scenario, links, services, settings)
        file = str(scenario.source)
        if not urls["engine_url"] and any(scenario.phase_requests(p) for p in scenario.phases):
            raise ConfigError(file, scenario.locator.line_of(("workload",)) if scenario.locator else None,
                              "workload", f"the scenario sends requests but its stack {key} names no "
                              "x-kvchaos.engine_url")
        if not urls["recompute_url"] and scenario.checks.recompute_equivalence is not None:
            raise ConfigError(file, scenario.locator.line_of(("checks", "recompute_equivalence"))
                              if scenario.locator else None, "checks.recompute_equivalence",
                              f"needs a recompute twin, but the stack {key} names no x-kvchaos.recompute_url")
        scenarios.append(scenario)
    return scenarios


def infra_error_result(scenario: Scenario, run_id: str, run_dir: Path, error: str) -> RunResult:
    """A result for a scenario that could not run (stack did not start): exit code 3, with a
    report written so nothing is lost."""
    result = build_result(run_id=run_id, scenario=scenario.name, history=[], checks=[], seed=scenario.seed,
                          description=scenario.description, scenario_path=str(scenario.source),
                          stack=str(scenario.stack), xfail=scenario.xfail, error=error,
                          engine_bugs=scenario.engine.bugs)
    write_report(run_dir, result, [])
    return result


def run_suite(scenarios: list[Scenario], opts: SuiteOptions,
              say: Callable[[str], None] = lambda _m: None) -> tuple[list[RunResult], Path]:
    """Run validated scenarios in order, reusing one stack per stack file.

    Returns:
        ``(results, suite_dir)``; each run's report is in ``report_dir/<run_id>/``, the suite's
        ``suite.json``/``junit.xml`` in ``report_dir/<suite_id>/``.

    Raises:
        KeyboardInterrupt, RunInterrupted: after the current scenario healed its faults, wrote
            its report, and the stacks were brought down.
    """
    suite_id = new_run_id(opts.run_id_prefix + "suite")
    suite_dir = opts.report_dir / suite_id
    pool = StackPool(opts.backend, suite_dir / "stacks", keep=opts.keep_stack)
    results: list[RunResult] = []
    try:
        for scenario in scenarios:
            if opts.seed is not None:
                scenario.seed = opts.seed
            if opts.engine_bugs is not None:
                scenario.engine.bugs = list(opts.engine_bugs)
            run_id = new_run_id(opts.run_id_prefix + scenario.name)
            run_dir = opts.report_dir / run_id
            say(f"[{scenario.name}] preparing the stack")
            t0 = time.monotonic()
            try:
                stack = pool.acquire(Path(scenario.stack), scenario.stack_variables(), say=say)
            except (StackError, ConfigError) as exc:
                results.append(infra_error_result(scenario, run_id, run_dir, f"stack: {exc}"))
                continue
            setup_s = time.monotonic() - t0
            result = run_scenario(scenario, stack, run_dir, run_id=run_id, timeout_s=opts.timeout_s,
                                  progress=lambda m, n=scenario.name: say(f"[{n}] {m}"))
            pool.release(Path(scenario.stack), result)
            result.durations.stack_up_s = setup_s
            (run_dir / "result.json").write_text(result.model_dump_json(indent=2))
            results.append(result)
    finally:
        say("stopping stacks" if not opts.keep_stack else "leaving stacks up (--keep-stack)")
        pool.close()
        if results:
            write_suite(suite_dir, suite_id, results)
    return results, suite_dir
