"""Guidance of ``kvchaos explore``: prefer schedules that reach LMCache counter combinations not
seen before, and on a stack whose engine measures its branch coverage (one that passes the
variable ``KVCHAOS_ENGINE_COVERAGE`` to it: the reference engine), engine branches not run before.

    before a run ── LMCache /metrics (x-kvchaos.lmcache_http) ──┐
    after it ────── LMCache /metrics ───────────────────────────┴─> the counters (``*_total``)
        that grew: the run's combination, e.g. {lookup_hit_tokens, l2_prefetch_failure_chunks}
    with --guide --jobs 1 on such a stack, the engine records its branches under the run's id
        (coverage.py dynamic contexts, chaos/engine/measurement.py): the arcs not seen before
        (``branch_arcs``)
    a combination not seen before, or a branch not run before, makes the run "new"; the
    fault-kind set of the run gets the credit
    next run (--guide): among the next ``width`` generated candidates, the one whose fault-kind
        set has the best record, ``new runs / runs`` (a set never tried counts 1.0, so
        every set is tried once before one is preferred); ties: the earliest candidate

Without ``--guide`` the candidates run in their generated order (the same seed gives the same
scenarios). With it, the order depends on what earlier runs reached, so two explorations of one
seed agree only while their runs reach the same combinations.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from chaos.prometheus import text_samples

__all__ = ["CounterGuide", "branch_arcs", "counter_totals", "grown"]


def counter_totals(url: str, *, timeout_s: float = 5.0) -> dict[str, float] | None:
    """Each counter (a sample named ``*_total``) of a Prometheus ``/metrics`` page, summed over
    its labels; None when the page cannot be read (a server down after a kill)."""
    try:
        resp = httpx.get(url, timeout=timeout_s)
        resp.raise_for_status()
        samples = text_samples(resp.text)
    except (httpx.HTTPError, ValueError):
        return None
    out: dict[str, float] = {}
    for name, _labels, value in samples:
        if name.endswith("_total"):
            out[name] = out.get(name, 0.0) + value
    return out


def grown(before: dict[str, float] | None, after: dict[str, float] | None) -> frozenset[str] | None:
    """The counters that grew from ``before`` to ``after`` (a counter new in ``after`` counts
    when above 0); None when either is unknown."""
    if before is None or after is None:
        return None
    return frozenset(n for n, v in after.items() if v > before.get(n, 0.0))


def branch_arcs(data_dir: Path, context: str) -> frozenset[str] | None:
    """The engine's branches recorded under ``context`` in the coverage.py data files of
    ``data_dir`` (one ``.coverage.*`` per engine process, saved every second while it runs:
    chaos/engine/measurement.py), as ``"<file name>:<from>-><to>"`` (coverage.py's arcs; a
    negative line number is a function's entry or exit).

    Returns:
        The arcs; None when no data file could be read (the engine did not measure).
    """
    import coverage

    out: set[str] = set()
    read = False
    for path in sorted(Path(data_dir).glob(".coverage.*")):
        try:
            data = coverage.CoverageData(basename=str(path))
            data.read()
            data.set_query_contexts([f"^{re.escape(context)}$"])
            for measured in data.measured_files():
                out.update(f"{Path(measured).name}:{a}->{b}" for a, b in data.arcs(measured) or ())
        except Exception:  # noqa: BLE001 - a file the engine is writing, or not coverage data
            continue
        read = True
    return frozenset(out) if read else None


@dataclass
class CounterGuide:
    """The combinations and engine branches seen, and the record of each fault-kind set."""

    seen: set[frozenset[str]] = field(default_factory=set)
    branches: set[str] = field(default_factory=set)
    tries: dict[tuple[str, ...], int] = field(default_factory=dict)
    new: dict[tuple[str, ...], int] = field(default_factory=dict)

    def record(self, kinds: Sequence[str], combination: frozenset[str] | None,
               branches: frozenset[str] | None = None) -> bool:
        """Count one run of the fault-kind set ``kinds``; returns True when its counter
        combination is new or it ran an engine branch (``branches``, :func:`branch_arcs`) no
        run before it ran."""
        key = tuple(sorted(set(kinds)))
        self.tries[key] = self.tries.get(key, 0) + 1
        new_combination = combination is not None and combination not in self.seen
        if combination is not None:
            self.seen.add(combination)
        new_branches = bool(branches) and not branches <= self.branches  # type: ignore[operator]
        self.branches.update(branches or ())
        if not (new_combination or new_branches):
            return False
        self.new[key] = self.new.get(key, 0) + 1
        return True

    def score(self, kinds: Sequence[str]) -> float:
        """New runs (a new counter combination or engine branch) per run of this fault-kind
        set; 1.0 for a set never tried."""
        key = tuple(sorted(set(kinds)))
        n = self.tries.get(key, 0)
        return 1.0 if n == 0 else self.new.get(key, 0) / n

    def pick(self, candidates: Sequence[Any], kinds_of) -> int:
        """The position in ``candidates`` of the best-scored one (the first among equals)."""
        best, best_score = 0, -1.0
        for i, c in enumerate(candidates):
            s = self.score(kinds_of(c))
            if s > best_score:
                best, best_score = i, s
        return best
