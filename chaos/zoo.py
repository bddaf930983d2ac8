"""The bug zoo: the scenario catalogue against the clean engine and each planted bug.

    catalogue (scenarios/*.yaml) ──┐
    planted bugs (chaos.engine.bugs.BUGS) ──> plan: row -> scenarios to run
                                   │           (clean: every scenario; a bug: those in ZOO_MAP,
                                   │            or every one with --full, or --scenarios)
                                   ▼
    one StackPool for the whole zoo (a new bug restarts only the engine; a cell left holding
    locks or sessions gets LMCache and the engine restarted before the next) ─> RunResult per cell
                                   ▼
    reports/zoo/matrix.md + matrix.json; exit 1 when a planted bug escapes every scenario it
    ran or the clean engine does not pass one

    --repeat N: the whole zoo N times (run-1/ .. run-N/ under the output folder), then
    compare_matrices(): exit 1 also when the runs disagree on any cell (a flaky scenario or
    checker); cells that agree but were failed by other checks are listed, not failed

``--stack FILE`` runs every cell on that stack file; its ``x-kvchaos.planted_bugs`` names the
bug set (:func:`bug_set`): on ``compose/vllm-cpu.yml`` the wrappers of LMCache's vLLM connector
(chaos/vllm/bugs.py, its own map), and the clean row runs only the scenarios that map names
(a vLLM cell takes minutes).

``kvchaos coverage run`` (``coverage_run``) is the clean row alone, with the engine under branch
coverage (chaos/coverage.py measures and summarizes it).

A checker must have teeth: a scenario that passes the clean engine and fails the engine with a
planted bug "caught" it; a bug that passes every scenario it met "escaped". Seeds are the
scenarios' own (fixed), so reruns give the same matrix.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import typer

from chaos.engine.bugs import BUGS
from chaos.vllm import bugs as vllm_bugs
from chaos.proxy.real import PROXY_OPTION_HELP

__all__ = ["CLEAN", "ZOO_MAP", "Cell", "ZooMatrix", "cell_for", "compare_matrices", "coverage_run", "plan_rows",
           "run_zoo", "zoo"]

#: The row of the engine with no planted bug.
CLEAN = "clean"

#: Planted bug -> the catalogue scenarios meant to catch it (the default `kvchaos zoo` plan).
ZOO_MAP: dict[str, list[str]] = {
    "trust-failed-load": ["retrieve-fail-after-lookup", "load-fail-policy-fail"],
    "skip-abort-cleanup": ["cancel-storm", "lmcache-pause", "abort-during-lookup", "abort-during-load"],
    "hit-plus-one-token": ["chunk-boundary-full-hit", "apc-partial-chunk"],
    "hit-plus-one-chunk": ["chunk-boundary-full-hit", "smoke"],
    "drop-cache-salt": ["tenant-isolation"],
    "stale-blocks-on-resume": ["preemption", "preemption-out-of-blocks"],
    "retry-failed-load-forever": ["retrieve-fail-after-lookup", "lmcache-pause"],
    "repoll-timed-out-lookup": ["lookup-timeout", "lmcache-pause"],
    "no-reconnect": ["lmcache-restart", "lookup-timeout"],
    "store-before-compute": ["smoke", "ladder-engine-restart"],
    # Not apc-partial-chunk: its window (local hits and LMCache loads in one phase) is not this
    # bug's (the local cache covers the whole LMCache hit); with its 96-block pool that happens
    # only when eviction leaves a whole family resident, which depends on completion order:
    # caught in one of two `kvchaos zoo --repeat 3` runs, missed in the other.
    "keep-locks-on-local-hit": ["apc-local-covers-hit"],
    "store-after-hit-wrong-blocks": ["conversation-store-after-hit"],
    "short-free-after-failed-load": ["retrieve-dropped-slow-link", "retrieve-fail-after-lookup"],
    "hold-blocks-on-abort": ["cancel-storm", "abort-during-load"],
}

def bug_set(stack: Path | None) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The planted bugs a stack's engine takes and the scenarios meant to catch each.

    Args:
        stack: a stack file, or None for the scenarios' own (the reference stack).

    Returns:
        ``(bug name -> summary, bug name -> scenario names)``: the reference engine's
        (:data:`chaos.engine.bugs.BUGS`, :data:`ZOO_MAP`) unless the stack's
        ``x-kvchaos.planted_bugs`` is ``vllm`` (:data:`chaos.vllm.bugs.BUGS` and its map).

    Raises:
        ConfigError: the stack file is invalid.
    """
    if stack is not None:
        from chaos.stack.spec import load_stack

        if load_stack(stack).settings.planted_bugs == "vllm":
            return {n: b.summary for n, b in vllm_bugs.BUGS.items()}, vllm_bugs.ZOO_MAP
    return dict(BUGS), ZOO_MAP


#: What a cell shows. "caught": a planted bug made a check fail; "failed": the clean engine
#: failed a check; "error": the stack did not start; "-": not run.
Cell = Literal["caught", "passed", "failed", "inconclusive", "xfail", "xpass", "error", "interrupted", "-"]

EXIT_OK = 0
EXIT_ZOO_FAILED = 1


def cell_for(verdict: str, *, planted: bool, xfail: bool = False, error: bool = False) -> Cell:
    """The matrix cell of one run.

    Args:
        verdict: the run's verdict, "passed", "failed" or "unknown" (inconclusive).
        planted: whether the run's engine had a planted bug (a bug row) or not (the clean row).
        xfail: the scenario is marked ``xfail`` (a known upstream bug): its failure is not the
            engine's, so it neither catches a planted bug nor fails the clean engine; when all
            its checks pass the cell is "xpass" (the bug no longer shows: fixed upstream?).
        error: the run could not start (infrastructure error).

    Returns:
        "error", "xfail", "xpass", "inconclusive", "passed", or "caught" (bug row) / "failed"
        (clean row).
    """
    if error:
        return "error"
    if xfail:
        return "xpass" if verdict == "passed" else "xfail"
    if verdict == "passed":
        return "passed"
    if verdict == "failed":
        return "caught" if planted else "failed"
    return "inconclusive"


@dataclass
class ZooMatrix:
    """Rows (the clean engine, then planted bugs) x columns (scenario names) of cells.

    Attributes:
        rows: row names in order, ``CLEAN`` first.
        columns: scenario names in catalogue order.
        cells: ``cells[row][scenario]``; a pair missing from it was not run ("-").
        seconds: wall-clock seconds per run, same keys as ``cells``.
        runs: report folder per run, same keys as ``cells``.
        failed_checks: names of the checks that did not pass in each run (what caught a bug,
            or what failed the clean engine), same keys as ``cells``.
        equivalence: recompute_equivalence's rates in tolerant mode, same keys as ``cells``:
            ``{"noise_floor": [diverged, replayed], "hit_path": [diverged, requests],
            "hard": n, "verdict": str}``.
        diagnoses: the verdicts ``kvchaos diagnose`` gave the cell's failing requests
            (chaos/diagnose), e.g. ``"kv_content (zero) x3"``, same keys as ``cells``.
        shrunk: the cell's shrunk reproducer (``--shrink``): ``{"requests", "phases",
            "run_seconds", "shrink_seconds", "verified", "reruns", "path"}``.
        strict_clean: scenarios whose clean cell must also have the exit code 0 of `kvchaos
            run` (``--also-clean``): stricter than the cell for an xfail scenario, whose
            inconclusive run is an "xfail" cell but exit 4.
        exit_codes: each run's exit code as `kvchaos run` gives it, same keys as ``cells``.
    """

    rows: list[str]
    columns: list[str]
    cells: dict[str, dict[str, Cell]] = field(default_factory=dict)
    seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    runs: dict[str, dict[str, str]] = field(default_factory=dict)
    failed_checks: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    equivalence: dict[str, dict[str, dict]] = field(default_factory=dict)
    diagnoses: dict[str, dict[str, str]] = field(default_factory=dict)
    shrunk: dict[str, dict[str, dict]] = field(default_factory=dict)
    strict_clean: list[str] = field(default_factory=list)
    exit_codes: dict[str, dict[str, int]] = field(default_factory=dict)

    def cell(self, row: str, column: str) -> Cell:
        """The cell at (row, column), "-" when that pair was not run."""
        return self.cells.get(row, {}).get(column, "-")

    def set(self, row: str, column: str, cell: Cell, seconds: float | None = None,
            run: str | None = None, failed_checks: list[str] | None = None,
            exit_code: int | None = None) -> None:
        """Record one run's cell (and, optionally, its time in s, report folder, the names
        of the checks that did not pass and its `kvchaos run` exit code)."""
        self.cells.setdefault(row, {})[column] = cell
        if exit_code is not None:
            self.exit_codes.setdefault(row, {})[column] = exit_code
        if failed_checks is not None:
            self.failed_checks.setdefault(row, {})[column] = sorted(failed_checks)
        if seconds is not None:
            self.seconds.setdefault(row, {})[column] = round(seconds, 1)
        if run is not None:
            self.runs.setdefault(row, {})[column] = run

    def escaped(self) -> list[str]:
        """Planted bugs that ran at least one scenario and no scenario caught, or ran none."""
        return [r for r in self.rows if r != CLEAN
                and not any(c == "caught" for c in self.cells.get(r, {}).values())]

    def clean_failures(self) -> list[str]:
        """Scenarios the clean engine did not pass (failed, inconclusive or error), and those
        of ``strict_clean`` whose run's exit code was not 0."""
        codes = self.exit_codes.get(CLEAN, {})
        return [s for s, c in self.cells.get(CLEAN, {}).items()
                if c not in ("passed", "xfail", "xpass") or (s in self.strict_clean and codes.get(s, 0) != 0)]

    def exit_code(self) -> int:
        """0 when every planted bug row is caught by some scenario and the clean engine passes
        every scenario it ran; 1 otherwise."""
        return EXIT_ZOO_FAILED if self.escaped() or self.clean_failures() else EXIT_OK

    def to_json(self) -> dict:
        """matrix.json: rows, columns, cells (with "-" filled in), escapes, clean failures."""
        return {
            "rows": self.rows,
            "columns": self.columns,
            "cells": {r: {c: self.cell(r, c) for c in self.columns} for r in self.rows},
            "seconds": self.seconds,
            "runs": self.runs,
            "failed_checks": self.failed_checks,
            "equivalence": self.equivalence,
            "diagnoses": self.diagnoses,
            "shrunk": self.shrunk,
            "strict_clean": self.strict_clean,
            "exit_codes": self.exit_codes,
            "escaped": self.escaped(),
            "clean_failures": self.clean_failures(),
            "exit_code": self.exit_code(),
        }

    def to_markdown(self) -> str:
        """matrix.md: one table, rows = engines, columns = scenarios, plus the verdict lines."""
        head = ["engine \\ scenario", *self.columns]
        lines = ["# Bug zoo", "",
                 "Cells: caught (a planted bug failed a check), passed, failed (the clean engine "
                 "failed), inconclusive (a fault never bit), xfail (known upstream bug), xpass (a known "
                 "upstream bug no longer shows: fixed upstream?), error "
                 "(stack did not start), - (not run).", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in self.rows:
            lines.append("| " + " | ".join([f"`{r}`", *(self.cell(r, c) for c in self.columns)]) + " |")
        lines.append("")
        caught = [(r, c, self.failed_checks.get(r, {}).get(c, [])) for r in self.rows for c in self.columns
                  if self.cell(r, c) in ("caught", "failed")]
        if caught:
            lines.append("Checks that failed (what caught each bug; for the clean engine, what failed):")
            lines.append("")
            lines += [f"- `{r}` / {c}: {', '.join(checks) or 'no check recorded'}" for r, c, checks in caught]
            lines.append("")
        if self.equivalence:
            lines += ["Tolerant recompute_equivalence, per cell: noise floor (the twin against itself) "
                      "and hit-path divergence (requests served from a cache that differ from recompute), "
                      "hard divergences (beyond the margin rule), verdict:", ""]
            for r in self.rows:
                for c in self.columns:
                    e = self.equivalence.get(r, {}).get(c)
                    if e:
                        lines.append(f"- `{r}` / {c}: floor {_frac(e['noise_floor'])}, hit path "
                                     f"{_frac(e['hit_path'])}, hard {e['hard']}, {e['verdict']}")
            lines.append("")
        lines += self._diagnosis_lines()
        esc, bad = self.escaped(), self.clean_failures()
        lines.append(f"Escaped planted bugs: {', '.join(esc) if esc else 'none'}.")
        if self.strict_clean:
            lines.append(f"Clean engine judged as `kvchaos run` (exit 0 too): {', '.join(self.strict_clean)}.")
        lines.append(f"Clean engine not passing: {', '.join(bad) if bad else 'none'}.")
        lines.append(f"Exit code: {self.exit_code()}.")
        return "\n".join(lines) + "\n"

    def _diagnosis_lines(self) -> list[str]:
        """The table of caught cells: the diagnosis their failing requests got and the size of
        their shrunk reproducer (empty when neither was recorded)."""
        cells = [(r, c) for r in self.rows for c in self.columns if self.cell(r, c) in ("caught", "failed")
                 and (c in self.diagnoses.get(r, {}) or c in self.shrunk.get(r, {}))]
        if not cells:
            return []
        out = ["Diagnosis (`kvchaos diagnose`) and shrunk reproducer (`kvchaos shrink`) of each catch:", "",
               "| engine | scenario | diagnosis | shrunk: requests | phases | seconds (one run) | shrink wall time |",
               "|---|---|---|---|---|---|---|"]
        for r, c in cells:
            sh = self.shrunk.get(r, {}).get(c)
            size = ([str(sh.get("requests")), str(sh.get("phases")), f"{sh.get('run_seconds', 0):.1f}",
                     f"{sh.get('shrink_seconds', 0):.0f}s" + ("" if sh.get("verified") == sh.get("reruns")
                                                               else f" (fails {sh.get('verified')}/{sh.get('reruns')})")]
                    if sh else ["-", "-", "-", "-"])
            out.append("| " + " | ".join([f"`{r}`", c, self.diagnoses.get(r, {}).get(c, "-"), *size]) + " |")
        return out + [""]

    def write(self, out_dir: Path) -> tuple[Path, Path]:
        """Write ``matrix.md`` and ``matrix.json`` into ``out_dir`` (created); returns both paths."""
        out_dir.mkdir(parents=True, exist_ok=True)
        md, js = out_dir / "matrix.md", out_dir / "matrix.json"
        md.write_text(self.to_markdown())
        js.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return md, js


def _frac(pair: list[int]) -> str:
    part, whole = pair
    return f"{part}/{whole}" + (f" ({part / whole:.0%})" if whole else "")


def equivalence_rates(result: object) -> dict | None:
    """The tolerant recompute_equivalence rates of a run (None: not run in tolerant mode)."""
    for c in getattr(result, "checks", []):
        d = c.details or {}
        if c.name == "recompute_equivalence" and d.get("mode") == "tolerant":
            floor, hits = d.get("noise_floor") or {}, d.get("hit_path") or {}
            return {"noise_floor": [floor.get("diverged", 0), floor.get("replayed", 0)],
                    "hit_path": [hits.get("diverged", 0), hits.get("requests", 0)],
                    "hard": len(d.get("mismatches") or []), "verdict": c.verdict}
    return None


def compare_matrices(matrices: list[ZooMatrix], *, cells_only: bool = True) -> list[str]:
    """Where repeated zoo runs disagree, one line per (row, scenario).

    With ``cells_only`` (the matrix): the cell differs between runs, e.g.
    ``"clean / lookup-timeout: passed | failed (liveness) | passed"``. Otherwise: the cell is the
    same in every run but the set of failed checks is not, e.g. ``"no-reconnect /
    lmcache-restart: caught (hit_recovery) | caught (hit_recovery, leaks)"`` (a planted bug
    whose damage depends on timing). An empty list means no such disagreement.

    Raises:
        ValueError: no matrix given.
    """
    if not matrices:
        raise ValueError("compare_matrices needs at least one matrix")
    rows = list(dict.fromkeys(r for m in matrices for r in m.rows))
    columns = list(dict.fromkeys(c for m in matrices for c in m.columns))
    out = []
    for r in rows:
        for c in columns:
            cells = [m.cell(r, c) for m in matrices]
            checks = [m.failed_checks.get(r, {}).get(c, []) for m in matrices]
            cells_differ = len(set(cells)) > 1
            checks_differ = len({tuple(x) for x in checks}) > 1
            if (cells_differ if cells_only else (checks_differ and not cells_differ)):
                shown = [cell + (f" ({', '.join(x)})" if x else "") for cell, x in zip(cells, checks)]
                out.append(f"{r} / {c}: {' | '.join(shown)}")
    return out


def plan_rows(catalogue: list[str], bugs: Iterable[str], *, full: bool = False,
              scenarios: list[str] | None = None,
              zoo_map: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """Which scenarios each row runs.

    Args:
        catalogue: every scenario name, in order.
        bugs: the planted bugs to run (rows besides ``CLEAN``).
        full: every row runs every scenario.
        scenarios: every row runs exactly these (overrides ``full`` and the map).
        zoo_map: bug -> scenarios meant to catch it (default ``ZOO_MAP``).

    Returns:
        ``{row: [scenario names in catalogue order]}``, ``CLEAN`` first.

    Raises:
        ValueError: a name in ``scenarios`` or in the map is not in the catalogue.
    """
    zoo_map = ZOO_MAP if zoo_map is None else zoo_map
    known = set(catalogue)
    if scenarios is not None:
        unknown = [s for s in scenarios if s not in known]
        if unknown:
            raise ValueError(f"unknown scenario(s) {unknown}; the catalogue has: {', '.join(catalogue)}")
        chosen = [s for s in catalogue if s in set(scenarios)]
        return {row: list(chosen) for row in [CLEAN, *bugs]}
    plan: dict[str, list[str]] = {CLEAN: list(catalogue)}
    for bug in bugs:
        if full:
            plan[bug] = list(catalogue)
            continue
        wanted = zoo_map.get(bug, [])
        unknown = [s for s in wanted if s not in known]
        if unknown:
            raise ValueError(f"ZOO_MAP[{bug!r}] names {unknown}, not in the catalogue")
        plan[bug] = [s for s in catalogue if s in set(wanted)]
    return plan


def diagnosis_summary(run_dir: Path) -> str | None:
    """The verdicts of a run's diagnosis.json as one cell, e.g. ``kv_content (zero) x3``
    (most frequent first), None when the run has no diagnosis."""
    from collections import Counter

    from chaos.diagnose.diagnose import load_diagnosis

    diag = load_diagnosis(run_dir)
    if diag is None:
        return None
    if diag.error:
        return "diagnosis error"
    if not diag.requests:
        return "no request diagnosed"
    counts = Counter(diag.verdicts().values())
    return ", ".join(f"{v} x{n}" if n > 1 else v for v, n in counts.most_common())


def _record(matrix: ZooMatrix, row: str, scenario, result, run_dir: Path, elapsed: float,
            say: Callable[[str], None]) -> str:
    """Put one cell's run into the matrix (its cell, time, failed checks, equivalence rates and
    diagnosis); returns the cell."""
    cell = cell_for(result.verdict, planted=row != CLEAN,
                    xfail=result.xfail is not None and not result.xfail.unexpected, error=result.error is not None)
    failing = [c.name for c in result.checks if c.verdict != "passed"]
    matrix.set(row, scenario.name, cell, elapsed, str(run_dir), failed_checks=failing, exit_code=result.exit_code)
    rates = equivalence_rates(result)
    if rates is not None:
        matrix.equivalence.setdefault(row, {})[scenario.name] = rates
    say(f"[{row}] {scenario.name}: {cell} ({elapsed:.1f}s)")
    if cell in ("caught", "failed") and (why := diagnosis_summary(run_dir)):
        matrix.diagnoses.setdefault(row, {})[scenario.name] = why
    return cell


def _run_zoo_parallel(scenario_paths: list[Path], plan: dict[str, list[str]], matrix: ZooMatrix, *,
                      report_dir: Path, backend: str, timeout_s: float, shrink_budget_s: float | None,
                      say: Callable[[str], None], overrides: dict, jobs: int,
                      stack_file: Path | None = None) -> ZooMatrix:
    """The zoo's cells as one campaign (chaos/campaign.py) over ``jobs`` workers, each with its
    own stack pool: a cell whose run left something held or disrupted a process gets a fresh
    stack (the pool's rule, stronger than the serial zoo's restart of what holds something).
    With one worker the cells run in :func:`chaos.campaign.one_pool_order` (rows mixed: the
    fewest engine restarts). Caught cells are shrunk afterwards, one at a time, on a pool of
    their own."""
    from chaos import interrupts
    from chaos.campaign import one_pool_order, run_campaign
    from chaos.diagnose.hook import diagnose_after_checks
    from chaos.runner.stacks import StackPool
    from chaos.runner.suite import SuiteOptions, load_and_validate
    from chaos.stack.base import new_run_id

    cells: list[tuple[str, object]] = []
    for row, names in plan.items():
        for scenario in load_and_validate(scenario_paths, stack_file, **overrides):
            if scenario.name in names:
                scenario.engine.bugs = [] if row == CLEAN else [row]
                cells.append((row, scenario))
    if jobs == 1:
        cells = [cells[i] for i in one_pool_order([sc for _row, sc in cells])]
    opts = SuiteOptions(backend=backend, report_dir=report_dir, timeout_s=timeout_s, run_id_prefix="zoo-",
                        after_checks=diagnose_after_checks)
    say(f"{len(cells)} cells over {jobs} workers")
    try:
        results, _suite = run_campaign([sc for _row, sc in cells], opts, jobs, say)
    except interrupts.RunInterrupted as stop:
        for (row, scenario), result in zip(cells, stop.results or []):
            if result.verdict == "interrupted":
                matrix.set(row, scenario.name, "interrupted", None, str(report_dir / result.run_id), failed_checks=[])
            else:
                _record(matrix, row, scenario, result, report_dir / result.run_id,
                        result.durations.total_s or 0.0, say)
        stop.results = [matrix]
        raise
    caught = []
    for (row, scenario), result in zip(cells, results):
        run_dir = report_dir / result.run_id
        took = (result.durations.total_s or 0.0) + (result.durations.stack_up_s or 0.0)
        if _record(matrix, row, scenario, result, run_dir, took, say) == "caught":
            caught.append((row, scenario.name, run_dir))
    if shrink_budget_s is not None and caught:
        pool = StackPool(backend, report_dir / new_run_id("zoo-shrink-stacks"))
        try:
            for row, name, run_dir in caught:
                matrix.shrunk.setdefault(row, {})[name] = _shrink_cell(run_dir, pool, shrink_budget_s, say)
        finally:
            try:
                pool.close()
            except KeyboardInterrupt:  # held until the stacks were down
                pass
    return matrix


def run_zoo(scenario_paths: list[Path], plan: dict[str, list[str]], *, report_dir: Path,
            backend: str = "local", timeout_s: float = 600.0, shrink_budget_s: float | None = None,
            say: Callable[[str], None] = lambda _m: None, coverage: object | None = None,
            numerics: str | None = None, equivalence: str | None = None,
            stack: Path | None = None, jobs: int = 1, strict_clean: Iterable[str] = ()) -> ZooMatrix:
    """Run the plan on one stack pool and fill the matrix (with ``jobs`` > 1 or ``strict_clean``:
    as a campaign over that many workers, each with its own stacks, the pool's isolation rule
    of `kvchaos run`; not with ``coverage``, which measures one engine process).

    Each row reloads its scenarios (the runner mutates them) and overrides ``engine.bugs`` with
    the row's bug (``[]`` for ``CLEAN``), keeping each scenario's seed and other engine options.

    Args:
        scenario_paths: the catalogue files.
        plan: ``plan_rows``'s answer.
        report_dir: parent of the run folders.
        backend: "local" or "compose".
        timeout_s: per-scenario deadline for the phases.
        shrink_budget_s: when set, shrink every caught cell (``kvchaos shrink``, on the same
            stack pool) with this search budget and record the reproducer's size.
        say: progress lines.
        coverage: a ``chaos.coverage.EngineCoverage``: the engine records branch coverage,
            each cell under the context ``<row>/<scenario>``.
        numerics: every row's engine numerics (``batch-dependent``); None keeps the scenarios'.
        equivalence: every scenario's recompute_equivalence mode (``tolerant``); None keeps it.
        stack: run every scenario on this stack file instead of its own (its planted bugs are
            the set :func:`bug_set` names).
        jobs: worker processes (chaos/campaign.py); 1: this process, one pool.
        strict_clean: scenarios whose clean cell must also exit 0 as `kvchaos run` would
            (:attr:`ZooMatrix.strict_clean`, ``--also-clean``).

    Raises:
        ConfigError: a scenario file is invalid.
        ValueError: ``jobs`` > 1 or ``strict_clean`` with ``coverage``.
        RunInterrupted: SIGINT / SIGTERM; ``.results`` is ``[the partial matrix]``.
    """
    from chaos.diagnose.hook import diagnose_after_checks
    from chaos.runner.leaks import restart_dirty
    from chaos.runner.run import run_scenario
    from chaos.runner.stacks import StackPool
    from chaos.runner.suite import infra_error_result, load_and_validate
    from chaos.stack.base import StackError, new_run_id
    from chaos.yamlsource import ConfigError

    overrides = {"numerics": numerics, "equivalence": equivalence}
    stack_file = stack  # `stack` below is each cell's running stack
    columns = [s.name for s in load_and_validate(scenario_paths, stack_file, **overrides)]
    matrix = ZooMatrix(rows=list(plan), columns=columns, strict_clean=[c for c in columns if c in set(strict_clean)])
    if jobs > 1 or matrix.strict_clean:
        if coverage is not None:
            raise ValueError("--jobs > 1 and --also-clean cannot measure coverage (one engine process records it)")
        return _run_zoo_parallel(scenario_paths, plan, matrix, report_dir=report_dir, backend=backend,
                                 timeout_s=timeout_s, shrink_budget_s=shrink_budget_s, say=say,
                                 overrides=overrides, jobs=jobs, stack_file=stack_file)

    from chaos import interrupts
    from chaos.runner.suite import interrupted_result

    pool = StackPool(backend, report_dir / new_run_id("zoo-stacks"))
    current: tuple | None = None  # (row, scenario, run_id, run_dir) of the cell under way
    try:
        for row, names in plan.items():
            bugs = [] if row == CLEAN else [row]
            for scenario in load_and_validate(scenario_paths, stack_file, **overrides):
                if scenario.name not in names:
                    continue
                scenario.engine.bugs = list(bugs)
                run_id = new_run_id(f"zoo-{row}-{scenario.name}")
                run_dir = report_dir / run_id
                say(f"[{row}] {scenario.name}")
                t0 = time.monotonic()
                variables = scenario.stack_variables()
                if coverage is not None:
                    variables.update(coverage.variables)  # type: ignore[attr-defined]
                current = (row, scenario, run_id, run_dir)
                try:
                    stack = pool.acquire(Path(scenario.stack), variables, say=say)
                    restart_dirty(stack, say)  # every cell starts from a stack that holds nothing
                except (StackError, ConfigError) as exc:
                    result = infra_error_result(scenario, run_id, run_dir, f"stack: {exc}")
                    pool.release(Path(scenario.stack), result)  # a stack half restarted: afresh next
                else:
                    if coverage is not None:  # after the reset: only the scenario's own paths
                        coverage.switch(f"{row}/{scenario.name}")  # type: ignore[attr-defined]
                    result = run_scenario(scenario, stack, run_dir, run_id=run_id, timeout_s=timeout_s,
                                          progress=lambda m, n=scenario.name: say(f"[{row}] [{n}] {m}"),
                                          after_checks=diagnose_after_checks)
                if coverage is not None:
                    coverage.switch("idle")  # type: ignore[attr-defined]
                current = None
                cell = _record(matrix, row, scenario, result, run_dir, time.monotonic() - t0, say)
                if cell == "caught" and shrink_budget_s is not None:
                    matrix.shrunk.setdefault(row, {})[scenario.name] = _shrink_cell(run_dir, pool, shrink_budget_s, say)
    except KeyboardInterrupt as exc:  # Ctrl-C / SIGTERM: stop the zoo, not one cell
        stop = interrupts.as_interrupt(exc)
        if current is not None:
            row, scenario, run_id, run_dir = current
            result = stop.result or interrupted_result(scenario, run_id, run_dir, stop)
            matrix.set(row, scenario.name, "interrupted", None, str(run_dir), failed_checks=[])
        stop.results = [matrix]
        raise stop
    finally:
        try:
            pool.close()
        except KeyboardInterrupt:  # held until the stacks were down; the zoo stops anyway
            pass
    return matrix


#: A shrink's search gets at least this many of a run's own durations: a cell whose runs take
#: a minute (a restart, a reconnect wait) needs about ten candidates to reach the zoo's bound
#: (tests/shrink/test_shrink_units.py), whatever ``--shrink-budget`` says. With planted engine
#: bugs each accepted candidate also gets a control run on the clean engine: twice that.
SHRINK_RUNS_AT_LEAST = 10


def shrink_budget_for(run_dir: Path, budget_s: float) -> tuple[float, int]:
    """The search budget of one cell's shrink: ``(seconds, runs)``. Seconds: ``budget_s``, or
    ``runs`` times the caught run's ``durations.total_s`` when that is more; runs:
    :data:`SHRINK_RUNS_AT_LEAST` (twice that when the run has ``engine_bugs``: control runs),
    also applied by the shrink to its own first run (``runs_at_least``: a candidate's run on
    the shrink's stack, with an engine restart between bugs on and off, can take several times
    the caught run's, e.g. 25-60 s for a lookup-timeout run of 10 s). A result.json that cannot
    be read (or has no durations) gives ``(budget_s, SHRINK_RUNS_AT_LEAST)``."""
    try:
        result = json.loads((Path(run_dir) / "result.json").read_text())
        run_s = float(result["durations"]["total_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return budget_s, SHRINK_RUNS_AT_LEAST
    runs = SHRINK_RUNS_AT_LEAST * (2 if result.get("engine_bugs") else 1)
    return max(budget_s, runs * run_s), runs


def _shrink_cell(run_dir: Path, pool: object, budget_s: float, say: Callable[[str], None]) -> dict:
    """``kvchaos shrink`` of one caught cell on the zoo's stack pool; its size and times."""
    from chaos.shrink.cli import run_shrink

    t0 = time.monotonic()
    budget_s, runs = shrink_budget_for(run_dir, budget_s)
    try:
        res, path = run_shrink(run_dir, budget_s=budget_s, runs_at_least=runs, pool=pool, say=say)
    except Exception as exc:  # noqa: BLE001 - one cell's shrink must not stop the zoo
        return {"error": f"{type(exc).__name__}: {exc}", "shrink_seconds": round(time.monotonic() - t0, 1)}
    say(f"shrunk {run_dir.name}: {res.final} in {res.seconds:.0f}s")
    return {**res.final, "run_seconds": res.run_seconds, "shrink_seconds": round(time.monotonic() - t0, 1),
            "verified": res.verified, "reruns": res.reruns, "path": str(path)}


def zoo(
    scenarios_dir: Path = typer.Option(Path("scenarios"), "--catalogue", help="folder of catalogue scenarios"),
    scenarios: list[str] = typer.Option(None, "--scenarios", "-s",
                                        help="run only these scenarios (names; repeatable or comma-separated)"),
    exclude: list[str] = typer.Option(None, "--exclude", "-x",
                                      help="leave these scenarios out of the catalogue (repeatable or comma-separated)"),
    bugs: list[str] = typer.Option(None, "--bug", help="only these planted bugs (repeatable; default all)"),
    full: bool = typer.Option(False, "--full", help="every bug against every scenario"),
    out: Path = typer.Option(Path("reports/zoo"), "--out", help="where matrix.md and matrix.json go"),
    report_dir: Path = typer.Option(Path("reports"), "--report-dir", help="parent folder of run reports"),
    backend: str = typer.Option("local", "--backend", "-b", envvar="KVCHAOS_BACKEND", help="local or compose"),
    proxy: str | None = typer.Option(None, "--proxy", envvar="KVCHAOS_PROXY", help=PROXY_OPTION_HELP),
    timeout: float = typer.Option(600.0, "--timeout", help="per-scenario deadline for the phases (s)"),
    repeat: int = typer.Option(1, "--repeat", min=1, max=20,
                               help="run the whole zoo N times and require the same matrix each time"),
    coverage_dir: Path = typer.Option(None, "--coverage", help="also measure the engine's branch "
                                      "coverage per cell into this folder (chaos/coverage.py; local backend)"),
    numerics: str = typer.Option(None, "--numerics", help="engine numerics of every row: exact | "
                                 "batch-dependent (results depend on the batch, as non-batch-invariant "
                                 "GPU kernels do)"),
    equivalence: str = typer.Option(None, "--equivalence", help="recompute_equivalence mode of every "
                                    "scenario: exact | tolerant (margin rule + noise floor)"),
    shrink: bool = typer.Option(False, "--shrink", help="shrink every caught cell (kvchaos shrink) and "
                                "record its reproducer's size (slow: minutes per cell)"),
    stack: Path = typer.Option(None, "--stack", help="run every cell on this stack file (its "
                               "x-kvchaos.planted_bugs names the bug set: compose/vllm-cpu.yml has its own)"),
    shrink_budget: float = typer.Option(180.0, "--shrink-budget", help="search seconds per shrink (at least "
                                        "10 times the caught run's and the shrink's first run's duration, 20 with planted bugs: "
                                        "control runs)"),
    jobs: str = typer.Option("1", "--jobs", "-j", help="cells run at once, each worker with its own stacks "
                             "(a number or auto: chaos/campaign.py default_jobs); not with --coverage"),
    also_clean: list[Path] = typer.Option(None, "--also-clean", help="also run this scenario file on the "
                                          "clean engine only (repeatable), judged as `kvchaos run` judges "
                                          "it (exit 0), on the zoo's stacks (one stack start for a suite and "
                                          "the bugs); not with --coverage"),
) -> None:
    """Run the catalogue against the clean reference engine and each planted ``--bug``.

    Writes OUT/matrix.md and OUT/matrix.json (with ``--repeat N``: each run's under OUT/run-K/,
    and OUT/matrix.* is the last run's plus the comparison). Exit codes: 0 every planted bug was
    caught by some scenario, the clean engine passed every scenario, and repeated runs gave the
    same matrix (cells); 1 otherwise; 2 bad arguments or an invalid scenario
    file. An ``--also-clean`` scenario's clean cell passes only when its run would exit 0
    under `kvchaos run` (the zoo's own clean cells accept an xfail scenario's inconclusive run).
    """
    from chaos.scenario.loader import discover_scenarios
    from chaos.runner.suite import load_and_validate
    from chaos.yamlsource import ConfigError

    from chaos.proxy.real import use_proxy

    try:
        use_proxy(proxy)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        known_bugs, zoo_map = bug_set(stack)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    chosen_bugs = list(bugs) if bugs else sorted(known_bugs)
    unknown = [b for b in chosen_bugs if b not in known_bugs]
    if unknown:
        typer.echo(f"error: unknown --bug {unknown}; known: {', '.join(sorted(known_bugs))}", err=True)
        raise typer.Exit(2)
    names = [n.strip() for s in (scenarios or []) for n in s.split(",") if n.strip()] or None
    from chaos.campaign import parse_jobs

    try:
        workers = parse_jobs(jobs)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if (workers > 1 or also_clean) and coverage_dir is not None:
        typer.echo("error: --jobs > 1 and --also-clean cannot be combined with --coverage (one engine process "
                   "records it)", err=True)
        raise typer.Exit(2)
    if numerics not in (None, "exact", "batch-dependent") or equivalence not in (None, "exact", "tolerant"):
        typer.echo("error: --numerics must be exact or batch-dependent, --equivalence exact or tolerant", err=True)
        raise typer.Exit(2)
    try:
        paths = discover_scenarios(scenarios_dir)
        catalogue = [s.name for s in load_and_validate(paths, numerics=numerics, equivalence=equivalence)]
        skip = {n.strip() for s in (exclude or []) for n in s.split(",") if n.strip()}
        if skip - set(catalogue):
            raise ValueError(f"--exclude names unknown scenario(s) {sorted(skip - set(catalogue))}")
        paths = [p for p, n in zip(paths, catalogue) if n not in skip]
        catalogue = [n for n in catalogue if n not in skip]
        extra = _also_clean(also_clean or [], paths, catalogue, numerics=numerics, equivalence=equivalence)
        if stack is not None and names is None and not full:
            # A stack of its own (vLLM: minutes a cell): the clean row runs what the map names.
            mapped = {n for b in chosen_bugs for n in zoo_map.get(b, [])} | set(extra)
            paths = [p for p, n in zip(paths, catalogue) if n in mapped]
            catalogue = [n for n in catalogue if n in mapped]
        plan = plan_rows(catalogue, chosen_bugs, full=full, scenarios=names, zoo_map=zoo_map)
        plan[CLEAN] = [n for n in catalogue if n in set(plan[CLEAN]) | set(extra)]
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    wanted = {n for ns in plan.values() for n in ns}
    paths = [p for p, n in zip(paths, catalogue) if n in wanted]
    from chaos import interrupts

    try:
        _zoo_runs(paths, plan, catalogue, report_dir, backend, timeout, repeat, out,
                  coverage_dir=coverage_dir, shrink_budget_s=shrink_budget if shrink else None,
                  numerics=numerics, equivalence=equivalence, stack=stack, jobs=workers, strict_clean=extra)
    finally:
        interrupts.exit_on_signal()  # the zoo is over: a signal now only sets the exit code


def _also_clean(files: list[Path], paths: list[Path], catalogue: list[str], *, numerics: str | None,
                equivalence: str | None) -> list[str]:
    """The names of ``--also-clean``'s scenario files; one outside the catalogue folder is added
    to ``paths`` and ``catalogue`` (both changed in place).

    Raises:
        ConfigError: a file is invalid. ValueError: a name another file of the catalogue has.
    """
    from chaos.runner.suite import load_and_validate

    names = []
    for f, sc in zip(files, load_and_validate(list(files), numerics=numerics, equivalence=equivalence)):
        if sc.name not in catalogue:
            paths.append(f)
            catalogue.append(sc.name)
        elif Path(paths[catalogue.index(sc.name)]).resolve() != Path(f).resolve():
            raise ValueError(f"--also-clean {f}: its scenario {sc.name!r} is another file's in the catalogue "
                             f"({paths[catalogue.index(sc.name)]})")
        names.append(sc.name)
    return names


def _zoo_runs(paths: list[Path], plan: dict[str, list[str]], catalogue: list[str], report_dir: Path,
              backend: str, timeout: float, repeat: int, out: Path, *, coverage_dir: Path | None = None,
              shrink_budget_s: float | None = None, numerics: str | None = None,
              equivalence: str | None = None, stack: Path | None = None, jobs: int = 1,
              strict_clean: list[str] | None = None) -> None:
    from chaos import interrupts

    matrices: list[ZooMatrix] = []
    measure = None
    if coverage_dir is not None:
        from chaos.coverage import EngineCoverage

        measure = EngineCoverage(coverage_dir / "data")
    with interrupts.handling():
        try:
            for k in range(1, repeat + 1):
                if repeat > 1:
                    typer.echo(f"zoo run {k} of {repeat}", err=True)
                matrix = run_zoo(paths, plan, report_dir=report_dir, backend=backend, timeout_s=timeout,
                                 shrink_budget_s=shrink_budget_s, say=lambda m: typer.echo(m, err=True),
                                 coverage=measure, numerics=numerics, equivalence=equivalence, stack=stack,
                                 jobs=jobs, strict_clean=strict_clean or ())
                matrices.append(matrix)
                if repeat > 1:
                    matrix.write(out / f"run-{k}")
        except interrupts.RunInterrupted as exc:
            with interrupts.deferred():
                partial = exc.results[0] if exc.results else ZooMatrix(rows=list(plan), columns=catalogue)
                md, _js = partial.write(out / (f"run-{len(matrices) + 1}" if repeat > 1 else ""))
                note = (f"\nInterrupted by {exc.describe()}: the matrix is partial; the stacks are down "
                        "and the cell under way has its report.\n")
                md.write_text(partial.to_markdown() + note)
                typer.echo(partial.to_markdown() + note)
                typer.echo(f"matrix: {md}")
            raise typer.Exit(exc.exit_code) from None
        try:
            with interrupts.deferred():  # the matrix is written in full
                code = _write_matrices(matrices, repeat, out)
                if measure is not None:
                    from chaos.coverage import write_summary

                    typer.echo(write_summary(measure, paths, plan[CLEAN], coverage_dir), err=True)
        except interrupts.RunInterrupted as exc:  # came while it was written: the zoo had finished
            raise typer.Exit(exc.exit_code) from None
    raise typer.Exit(code)


def _write_matrices(matrices: list[ZooMatrix], repeat: int, out: Path) -> int:
    """Write OUT/matrix.md and .json (with the comparison of repeated runs); returns the exit
    code."""
    matrix = matrices[-1]
    code = max(m.exit_code() for m in matrices)
    md, js = matrix.write(out)
    extra = ""
    if repeat > 1:
        differ = compare_matrices(matrices)
        varied = compare_matrices(matrices, cells_only=False)
        if differ:
            code = EXIT_ZOO_FAILED
            extra = (f"\nReruns: the {repeat} runs disagree (cell (failed checks) per run):\n"
                     + "\n".join(f"- {d}" for d in differ) + "\n")
        else:
            extra = f"\nReruns: all {repeat} runs gave the same matrix.\n"
        if varied:
            extra += ("\nSame cell, other checks failing (timing-dependent damage; not a "
                      "disagreement):\n" + "\n".join(f"- {v}" for v in varied) + "\n")
        md.write_text(matrix.to_markdown() + extra)
        data = {**matrix.to_json(), "repeat": {"runs": repeat, "differences": differ,
                                               "failed_checks_varied": varied, "exit_code": code}}
        js.write_text(json.dumps(data, indent=2) + "\n")
    typer.echo(matrix.to_markdown() + extra)
    typer.echo(f"matrix: {md} {js}")
    return code


if __name__ == "__main__":  # python -m chaos.zoo
    typer.run(zoo)


# ``kvchaos coverage run``: the zoo's clean row, measured by chaos/coverage.py (its command group
# is wired in chaos/cli.py).
def coverage_run(
    scenarios_dir: Path = typer.Option(Path("scenarios"), "--catalogue", help="folder of catalogue scenarios"),
    scenarios: list[str] = typer.Option(None, "--scenarios", "-s", help="only these scenarios (comma-separated)"),
    out: Path = typer.Option(Path("reports/coverage"), "--out", help="coverage data, summary.json, coverage.md"),
    report_dir: Path = typer.Option(Path("reports"), "--report-dir", help="parent folder of run reports"),
    timeout: float = typer.Option(600.0, "--timeout", help="per-scenario deadline for the phases (s)"),
    update: bool = typer.Option(False, "--update-docs", help="store the summary as docs/coverage.json "
                                "and regenerate docs/coverage.md and docs/catalogue.md's map"),
) -> None:
    """Run the catalogue against the clean engine with the engine under branch coverage.

    Exit codes: 0 measured (whatever the verdicts; they are in OUT/matrix.md), 2 bad arguments
    or an invalid scenario file.
    """
    from chaos.coverage import (CATALOGUE_MD, COVERAGE_MD, SUMMARY_PATH, EngineCoverage, resolve_paths,
                                update_docs, write_summary)
    from chaos.runner.suite import load_and_validate
    from chaos.scenario.loader import discover_scenarios
    from chaos.yamlsource import ConfigError

    names = [n.strip() for s in (scenarios or []) for n in s.split(",") if n.strip()] or None
    try:
        paths = discover_scenarios(scenarios_dir)
        loaded = load_and_validate(paths)
        plan = plan_rows([s.name for s in loaded], [], scenarios=names)
        resolve_paths()
    except (ConfigError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    wanted = set(plan[CLEAN])
    paths = [p for p, s in zip(paths, loaded) if s.name in wanted]
    measure = EngineCoverage(out / "data")
    matrix = run_zoo(paths, plan, report_dir=report_dir, timeout_s=timeout,
                     say=lambda m: typer.echo(m, err=True), coverage=measure)
    matrix.write(out)
    typer.echo(write_summary(measure, paths, plan[CLEAN], out,
                             verdicts={s: matrix.cell(CLEAN, s) for s in plan[CLEAN]}))
    if update:
        summary = json.loads((out / "summary.json").read_text())
        SUMMARY_PATH.write_text(json.dumps(summary, indent=1) + "\n")
        update_docs(summary)
        typer.echo(f"updated {SUMMARY_PATH}, {COVERAGE_MD}, {CATALOGUE_MD}")
