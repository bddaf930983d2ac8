"""Suite summary: several scenario runs in one table, suite.json and one junit.xml."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from chaos.report.junit import write_junit
from chaos.report.model import (EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_INFRA, EXIT_PASSED, EXIT_UNPROVEN,
                                RUN_RANK, UNPROVEN, InterruptInfo, RunResult, SuiteEntry, SuiteResult)

_STYLE = {"passed": "green", "failed": "bold red", "unknown": "yellow", "interrupted": "magenta",
          UNPROVEN: "cyan"}


def _summary(r: RunResult) -> str:
    if r.interrupted is not None:
        return f"interrupted by {r.interrupted.describe()}"
    if r.error:
        return f"infrastructure error: {r.error}"
    bad = [c for c in r.checks if c.verdict != "passed"]
    if not bad and r.verdict == UNPROVEN:
        return "window not proven: " + "; ".join(c.summary for c in r.checks if c.name == "evidence")
    if not bad:
        return f"{len(r.checks)} checks passed"
    worst_first = sorted(bad, key=lambda c: c.verdict != "failed")
    beyond = f"beyond the known bug: {', '.join(r.xfail.unexpected)}; " if r.xfail and r.xfail.unexpected else ""
    return f"{beyond}{worst_first[0].name}: {worst_first[0].summary}"


def suite_exit_code(results: list[RunResult]) -> int:
    """The first interrupted run's code (130/143) if a signal stopped one, else 1 if any run
    exited 1, else 3 if any exited 3, else 4 if any exited 4, else 5 if any exited 5 (passed,
    window not proven), else 0."""
    for r in results:
        if r.interrupted is not None:
            return r.interrupted.exit_code
    codes = {r.exit_code for r in results}
    for code in (EXIT_FAILED, EXIT_INFRA, EXIT_INCONCLUSIVE, EXIT_UNPROVEN):
        if code in codes:
            return code
    return EXIT_PASSED if codes <= {EXIT_PASSED} else max(codes)


def build_suite(suite_id: str, results: list[RunResult], reports_dir: Path,
                interrupted: InterruptInfo | None = None) -> SuiteResult:
    """Summarise runs; run_dir entries are reports_dir/<run_id>, relative to reports_dir.
    ``interrupted``: the signal that stopped the suite (then verdict "interrupted" and its
    exit code, whatever the runs say)."""
    entries = [SuiteEntry(run_id=r.run_id, scenario=r.scenario, verdict=r.verdict, exit_code=r.exit_code,
                          xfail=r.xfail.outcome if r.xfail else None, summary=_summary(r),
                          duration_s=r.durations.total_s, run_dir=r.run_id)
               for r in results]
    interrupted = interrupted or next((r.interrupted for r in results if r.interrupted is not None), None)
    if interrupted is not None:
        return SuiteResult(suite_id=suite_id, verdict="interrupted", exit_code=interrupted.exit_code,
                           runs=entries, interrupted=interrupted)
    return SuiteResult(suite_id=suite_id, verdict=max((_counted_verdict(r) for r in results), key=RUN_RANK.__getitem__,
                                                      default="passed"),
                       exit_code=suite_exit_code(results), runs=entries)


def _counted_verdict(r: RunResult) -> str:
    """The run's verdict as the suite's verdict counts it: a run that failed as its scenario
    expects (XFAIL: exit 0, no check failed beyond the known bug's) counts as passed, as pytest
    counts an xfailed test in a green session; the run keeps its own verdict in the table."""
    expected_failure = (r.verdict == "failed" and r.xfail is not None and r.xfail.outcome == "xfailed"
                        and r.exit_code == EXIT_PASSED)
    return "passed" if expected_failure else r.verdict


def _xfail_counts(suite: SuiteResult) -> str:
    """", 1 xfailed, 1 xpassed" for the runs with those outcomes ("" when none)."""
    counts = {o: sum(e.xfail == o for e in suite.runs) for o in ("xfailed", "xpassed")}
    return "".join(f", {n} {o}" for o, n in counts.items() if n)


def write_suite(suite_dir: Path, suite_id: str, results: list[RunResult],
                interrupted: InterruptInfo | None = None) -> SuiteResult:
    """Write suite_dir/suite.json and suite_dir/junit.xml (one <testsuite> per run).

    Args:
        suite_dir: folder for the suite files (created if missing), usually reports/.
        suite_id: a name for the suite run.
        results: the runs' RunResults.
        interrupted: the signal that stopped the suite, if one did.
    Returns:
        the SuiteResult written.
    Raises:
        OSError: a file cannot be written.
    """
    suite_dir.mkdir(parents=True, exist_ok=True)
    suite = build_suite(suite_id, results, suite_dir, interrupted)
    (suite_dir / "suite.json").write_text(suite.model_dump_json(indent=2), encoding="utf-8")
    write_junit(suite_dir / "junit.xml", results, name=f"kvchaos.{suite_id}")
    return suite


def suite_table(suite: SuiteResult) -> Table:
    """A rich Table: scenario, verdict, exit code, duration, what went wrong."""
    t = Table(title=f"kvchaos suite {suite.suite_id}: {suite.verdict}{_xfail_counts(suite)} (exit {suite.exit_code})")
    for col in ("scenario", "verdict", "exit", "time", "summary"):
        t.add_column(col, overflow="fold", justify="right" if col in ("exit", "time") else "left")
    for e in suite.runs:
        verdict = f"[{_STYLE[e.verdict]}]{e.verdict}[/]" + (f" ({e.xfail})" if e.xfail else "")
        t.add_row(e.scenario, verdict, str(e.exit_code),
                  f"{e.duration_s:.1f}s" if e.duration_s is not None else "–", e.summary)
    return t


def print_suite(suite: SuiteResult, console: Console | None = None) -> None:
    """Print the suite table to the console (stdout when None)."""
    (console or Console()).print(suite_table(suite))
