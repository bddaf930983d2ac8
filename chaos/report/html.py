"""report.html: a self-contained page (inline CSS, JS and SVG; no external asset) per run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import jinja2

from chaos.report.model import RunResult
from chaos.report.timeline import build_timeline

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("chaos.report", "templates"),
    autoescape=jinja2.select_autoescape(["html", "j2"]),
    trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
)


def _fmt_s(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "–"
    if v < 1:
        return f"{v * 1000:.{max(0, digits - 2)}f} ms"
    return f"{v:.2f} s"


def _fmt_rate(v: float | None) -> str:
    return "–" if v is None else f"{v:.1%}"


def _fmt_g4(v: float | str | None) -> str:
    """A measured number to 4 significant digits; a non-finite one as the diagnosis JSON writes it
    ("Infinity", "NaN"), a missing one as a dash."""
    if v is None:
        return "–"
    if isinstance(v, str):
        return v
    return f"{v:.4g}"


_ENV.filters["secs"] = _fmt_s
_ENV.filters["g4"] = _fmt_g4
_ENV.filters["rate"] = _fmt_rate
_ENV.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=1, default=str)


def log_files(run_dir: Path, logs: str = "logs") -> list[str]:
    """Paths (relative to run_dir, '/'-separated) of the files under run_dir/logs, sorted."""
    base = run_dir / logs
    if not base.is_dir():
        return []
    return sorted(p.relative_to(run_dir).as_posix() for p in base.rglob("*") if p.is_file())


def render_html(result: RunResult, history: Iterable[Any], run_dir: Path | None = None) -> str:
    """Render report.html.

    Args:
        result: the run's RunResult.
        history: the run's ops (dicts or `Op` models), for the timeline.
        run_dir: the run directory, to list logs/ (None: no log links).
    Returns:
        the HTML text.
    """
    tl = build_timeline(result, history)
    logs = log_files(run_dir, result.paths.logs) if run_dir else []
    return _ENV.get_template("report.html.j2").render(r=result, tl=tl, logs=logs, diag=_diagnosis(run_dir))


def _diagnosis(run_dir: Path | None) -> dict[str, Any] | None:
    """run_dir/diagnosis.json (chaos/diagnose) as plain data for the "Why" section, or None."""
    if run_dir is None or not (run_dir / "diagnosis.json").is_file():
        return None
    try:
        return json.loads((run_dir / "diagnosis.json").read_text())
    except (OSError, ValueError):
        return None
