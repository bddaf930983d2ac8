"""Known upstream bugs: the catalogue's ``xfail`` scenarios, their write-ups and latest outcomes.

    scenarios/**.yaml with xfail ──┐
    docs/findings/*.md (pages) ────┼──> FindingRow (name, upstream, page, last outcome)
    reports/**/result.json ────────┘        └──> `kvchaos findings` table / JSON

A finding is an LMCache (or other upstream) bug kvchaos reproduces: a scenario marked
``xfail`` whose ``upstream`` says where it is reported (or "not yet reported"), and, for those
under ``scenarios/findings/``, a page in ``docs/findings/`` written as an upstream issue. A
nightly run shows an upstream fix as XPASS: the scenario's checks all passed although it is
expected to fail; ``kvchaos findings --reports reports --fail-on-xpass`` turns that into exit 1.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from chaos.scenario.loader import discover_scenarios, load_scenario
from chaos.yamlsource import ConfigError

__all__ = ["FindingRow", "PAGE_SCENARIO_RE", "pages_by_scenario", "latest_outcomes", "finding_rows"]

# A page names its reproducers by path: ``scenarios/findings/<name>.yaml``.
PAGE_SCENARIO_RE = re.compile(r"scenarios/findings/([a-z0-9-]+)\.yaml")

# Outcome words, as pytest prints them.
OUTCOME_WORDS = {"xfailed": "XFAIL", "xpassed": "XPASS"}


@dataclass
class FindingRow:
    """One xfail scenario.

    Attributes:
        name: the scenario name.
        file: the scenario file.
        upstream: the scenario's ``xfail.upstream`` ("" when unset).
        reason: the scenario's ``xfail.reason``.
        page: the docs/findings page that names the scenario, or None.
        outcome: the latest clean-engine run's outcome under the reports folder: ``XFAIL``
            (failed as expected), ``XPASS`` (every check passed: fixed upstream, or the scenario
            no longer reaches the bug), ``inconclusive``, ``error``, or None (no run found).
        run_dir: the folder of that run, or None.
        started_at: when that run started (ISO 8601), or None.
    """

    name: str
    file: str
    upstream: str
    reason: str
    page: str | None = None
    outcome: str | None = None
    run_dir: str | None = None
    started_at: str | None = None

    def as_dict(self) -> dict:
        """The row as a JSON-ready dict."""
        return asdict(self)


def pages_by_scenario(docs_dir: Path) -> dict[str, str]:
    """Which page names which scenario of ``scenarios/findings/``.

    Args:
        docs_dir: the ``docs/findings`` folder (missing: no pages).

    Returns:
        scenario name -> page path (the first page, by file name, that names it; the index
        README.md is not a page).
    """
    out: dict[str, str] = {}
    if not docs_dir.is_dir():
        return out
    for page in sorted(docs_dir.glob("*.md")):
        if page.name == "README.md":
            continue
        for name in PAGE_SCENARIO_RE.findall(page.read_text(encoding="utf-8")):
            out.setdefault(name, str(page))
    return out


def latest_outcomes(reports_dir: Path) -> dict[str, tuple[str, str, str | None]]:
    """The latest clean-engine outcome of each xfail scenario run under ``reports_dir``.

    Reads every ``result.json`` below the folder (``kvchaos run``, pytest and zoo runs alike);
    runs with planted engine bugs do not count, nor files that are not run results.

    Args:
        reports_dir: a reports folder (missing: nothing found).

    Returns:
        scenario name -> (outcome, run folder, started_at), outcome as in
        :attr:`FindingRow.outcome`; the run with the latest ``started_at`` wins.
    """
    best: dict[str, tuple[str, str, str | None]] = {}
    if not reports_dir.is_dir():
        return best
    for path in reports_dir.rglob("result.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict) or not data.get("xfail") or data.get("engine_bugs"):
            continue
        name = data.get("scenario")
        if not isinstance(name, str):
            continue
        xfail = data["xfail"] if isinstance(data["xfail"], dict) else {}
        if data.get("error"):
            outcome = "error"
        else:
            outcome = OUTCOME_WORDS.get(xfail.get("outcome") or "", "inconclusive")
        started = data.get("started_at")
        prev = best.get(name)
        if prev is None or (started or "") >= (prev[2] or ""):
            best[name] = (outcome, str(path.parent), started)
    return best


def finding_rows(scenarios_dir: Path, docs_dir: Path, reports_dir: Path | None = None
                 ) -> tuple[list[FindingRow], list[ConfigError]]:
    """Every xfail scenario under ``scenarios_dir`` with its page and latest outcome.

    Args:
        scenarios_dir: the catalogue folder (searched recursively).
        docs_dir: the findings pages folder.
        reports_dir: where run reports are (None: outcomes are not looked up).

    Returns:
        (rows sorted by file, the scenarios that did not load).

    Raises:
        ConfigError: ``scenarios_dir`` does not exist.
    """
    pages = pages_by_scenario(docs_dir)
    outcomes = latest_outcomes(reports_dir) if reports_dir is not None else {}
    rows: list[FindingRow] = []
    bad: list[ConfigError] = []
    for path in discover_scenarios(scenarios_dir):
        try:
            scenario = load_scenario(path, check_paths=False)
        except ConfigError as exc:
            bad.append(exc)
            continue
        if scenario.xfail is None:
            continue
        outcome, run_dir, started = outcomes.get(scenario.name, (None, None, None))
        rows.append(FindingRow(name=scenario.name, file=str(path),
                               upstream=scenario.xfail.upstream or "",
                               reason=" ".join(scenario.xfail.reason.split()),
                               page=pages.get(scenario.name), outcome=outcome, run_dir=run_dir,
                               started_at=started))
    return rows, bad
