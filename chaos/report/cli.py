"""`kvchaos report DIR`: re-render a run's junit.xml and report.html (wired by chaos/cli.py)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from chaos.report.writer import ReportError, render_report


def report(run_dir: Path) -> int:
    """Re-render reports/<run-id>/ from its result.json and history.jsonl.

    Args:
        run_dir: the run directory.
    Returns:
        exit code: 0 rendered (the path is printed), 2 the directory is not a valid run
        directory (the message says which file and what is wrong).
    """
    console = Console(stderr=True)
    try:
        html = render_report(Path(run_dir))
    except ReportError as exc:
        console.print(f"[red]kvchaos report:[/] {exc}")
        return 2
    Console().print(f"rendered {html}")
    return 0
