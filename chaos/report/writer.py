"""reports/<run-id>/: write a run's report files, or re-render them from result.json.

    reports/<run-id>/
      result.json     RunResult (source of truth)
      history.jsonl   the history, one op per line (the runner writes it live)
      junit.xml       one <testsuite>, one <testcase> per check
      report.html     self-contained page: checks, timeline, stats, faults, links
      logs/           service logs (the stack's collect_logs)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from chaos.checks.requests import op_dicts
from chaos.history import HistoryError, Op, load_history
from chaos.report.html import render_html
from chaos.report.junit import write_junit
from chaos.report.model import RunResult


class ReportError(Exception):
    """A run directory cannot be rendered (missing or invalid result.json / history.jsonl)."""


def write_history(path: Path, history: Iterable[Op | dict[str, Any]]) -> Path:
    """Write ops as JSON lines (one op per line, in the order given). Returns `path`."""
    with path.open("w", encoding="utf-8") as fh:
        for op in op_dicts(history):
            fh.write(json.dumps(op, default=str) + "\n")
    return path


def read_history(path: Path) -> list[Op]:
    """Read history.jsonl (chaos.history.load_history: a truncated last line is dropped).

    Raises:
        ReportError: the file is missing, or a line is not a valid op (file:line in the message).
    """
    try:
        return load_history(path)
    except FileNotFoundError:
        raise ReportError(f"{path}: no history file") from None
    except HistoryError as exc:
        raise ReportError(str(exc)) from None


def read_result(run_dir: Path) -> RunResult:
    """Load run_dir/result.json.

    Raises:
        ReportError: missing, not JSON, or not a RunResult (the message names the field).
    """
    path = run_dir / "result.json"
    if not path.is_file():
        raise ReportError(f"{path}: no result.json; is {run_dir} a kvchaos run directory (reports/<run-id>/)?")
    try:
        return RunResult.model_validate_json(path.read_text(encoding="utf-8"))
    except ValidationError as exc:
        raise ReportError(f"{path}: not a kvchaos result: {exc}") from None


def write_report(run_dir: Path, result: RunResult,
                 history: Iterable[Op | dict[str, Any]] | None = None) -> Path:
    """Write result.json, junit.xml and report.html into run_dir (history.jsonl too, when given
    and not yet written by the runner).

    Args:
        run_dir: reports/<run-id>/ (created if missing).
        result: the run's RunResult.
        history: the run's ops; None reads run_dir/history.jsonl.
    Returns:
        the path of report.html.
    Raises:
        ReportError: history is None and history.jsonl is missing or corrupt.
        OSError: a file cannot be written.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    hist_path = run_dir / result.paths.history
    ops: list[Any]
    if history is not None:
        ops = op_dicts(history)
        if not hist_path.exists():
            write_history(hist_path, ops)
    else:
        ops = read_history(hist_path)
    (run_dir / result.paths.result).write_text(result.model_dump_json(indent=2), encoding="utf-8")
    write_junit(run_dir / result.paths.junit, [result], name=f"kvchaos.{result.scenario}")
    html = run_dir / result.paths.html
    html.write_text(render_html(result, ops, run_dir), encoding="utf-8")
    return html


def render_report(run_dir: Path) -> Path:
    """Re-render junit.xml and report.html of a run from its result.json and history.jsonl
    (`kvchaos report DIR`).

    Returns:
        the path of report.html.
    Raises:
        ReportError: result.json or history.jsonl is missing or invalid.
    """
    run_dir = Path(run_dir)
    result = read_result(run_dir)
    return write_report(run_dir, result, read_history(run_dir / result.paths.history))
