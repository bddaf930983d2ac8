"""Compare the verdicts of two runs of the same scenarios (e.g. the bundled proxy against the
real Toxiproxy, or a quiet machine against a loaded one).

    python -m chaos.report.compare REPORTS_A REPORTS_B [--require-bitten] [--subset]
    python -m chaos.report.compare --expected REPORTS [REPORTS ...] [--require-bitten]

Each folder holds run folders (``<run-id>/result.json``, as ``kvchaos run --report-dir`` and
``pytest -m chaos --kvchaos-report-dir`` write them). A scenario that ran more than once in a
folder counts with its last run. Prints one line per scenario whose verdict (or exit code)
differs, or that ran in only one folder, and, with ``--require-bitten``, every fault that did
not bite; with ``--subset`` the second folder ran a subset of the first's scenarios (``make
test`` runs only the network-fault scenarios with the real Toxiproxy), so only scenarios of the
second folder are compared, and one missing from the first is still a difference; first it
prints which proxy served each folder's runs (result.json ``proxy``), so a
comparison of the bundled proxy with the real one shows that the real one ran; exit status 0 when there is none, 1 otherwise, 2 when a folder holds no run.

With ``--expected`` each folder is held against what the catalogue says instead of against
another run: a scenario without ``xfail`` must pass, a scenario with ``xfail`` (a known bug of
the pinned LMCache) must fail its checks (XFAIL). Every other verdict is a false one: a failed
or inconclusive clean scenario, an XPASS or an inconclusive finding, an infrastructure error,
an interrupted run. Used by ``make test-loaded`` (0 false verdicts under load).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ScenarioOutcome", "load_outcomes", "compare", "false_verdicts", "proxy_label", "proxies", "main"]


@dataclass
class ScenarioOutcome:
    """One scenario's last run in a report folder."""

    scenario: str
    verdict: str
    exit_code: int
    run_id: str
    started_at: str = ""
    not_bitten: list[str] = field(default_factory=list)  # "fault_id (kind): reason"
    error: str | None = None
    total_s: float | None = None
    xfail: bool = False
    proxy: str = ""  # "real 2.9.0", "bundled 0.1.0"; "" for a run that recorded none

    @property
    def key(self) -> tuple[str, int]:
        return self.verdict, self.exit_code


def load_outcomes(report_dir: Path) -> dict[str, ScenarioOutcome]:
    """``{scenario: outcome}`` from every ``*/result.json`` under ``report_dir`` (the last run of
    each scenario by start time)."""
    out: dict[str, ScenarioOutcome] = {}
    for path in sorted(Path(report_dir).glob("*/result.json")):
        try:
            r = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if "scenario" not in r or "verdict" not in r:
            continue
        bad = [f"{f.get('fault_id')} ({f.get('kind')}): "
               f"{(f.get('evidence') or {}).get('reason') or f.get('error') or 'did not bite'}"
               for f in r.get("faults") or [] if not f.get("bit")]
        o = ScenarioOutcome(r["scenario"], r["verdict"], int(r.get("exit_code", -1)), r.get("run_id", path.parent.name),
                            r.get("started_at") or "", bad, r.get("error"),
                            (r.get("durations") or {}).get("total_s"), r.get("xfail") is not None,
                            proxy_label(r.get("proxy")))
        prev = out.get(o.scenario)
        if prev is None or o.started_at >= prev.started_at:
            out[o.scenario] = o
    return out


def proxy_label(proxy: dict | None) -> str:
    """``"real 2.9.0"`` from result.json's ``proxy`` (``Stack.proxy_info``); "" when absent."""
    if not isinstance(proxy, dict):
        return ""
    return " ".join(str(x) for x in (proxy.get("impl"), proxy.get("version")) if x)


def proxies(outcomes: dict[str, ScenarioOutcome]) -> str:
    """``"real 2.9.0 (14 runs)"``, or each label with its count when a folder mixes proxies."""
    counts: dict[str, int] = {}
    for o in outcomes.values():
        counts[o.proxy or "none recorded"] = counts.get(o.proxy or "none recorded", 0) + 1
    return ", ".join(f"{k} ({v} run{'s' if v != 1 else ''})" for k, v in sorted(counts.items()))


def compare(a: dict[str, ScenarioOutcome], b: dict[str, ScenarioOutcome],
            require_bitten: bool = False, subset: bool = False) -> list[str]:
    """Lines describing each difference (empty: the same verdicts). With ``subset``, ``b`` ran a
    subset of ``a``'s scenarios: a scenario only ``a`` ran is no difference."""
    lines = []
    for name in sorted(set(b) if subset else set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            lines.append(f"{name}: ran only in {'the second' if x is None else 'the first'} folder")
            continue
        if x.key != y.key:
            why = "; ".join(filter(None, [y.error and y.error.splitlines()[0], *y.not_bitten[:2]]))
            lines.append(f"{name}: {x.verdict} (exit {x.exit_code}) vs {y.verdict} (exit {y.exit_code})"
                         + (f": {why}" if why else ""))
        if require_bitten:
            for side, o in (("first", x), ("second", y)):
                lines += [f"{name}: in the {side} folder, fault {f}" for f in o.not_bitten]
    return lines


def false_verdicts(outcomes: dict[str, ScenarioOutcome], require_bitten: bool = False) -> list[str]:
    """Lines naming each run of ``outcomes`` whose verdict is not the catalogue's expectation
    (``passed`` for a scenario without ``xfail``; ``failed``, i.e. XFAIL, for one with it), and,
    with ``require_bitten``, each fault of a run that did not bite. Empty: every verdict right."""
    lines = []
    for name in sorted(outcomes):
        o = outcomes[name]
        want = "failed" if o.xfail else "passed"
        if o.verdict != want:
            label = {"passed": "XPASS", "failed": "XFAIL"}.get(o.verdict, o.verdict) if o.xfail else o.verdict
            why = "; ".join(filter(None, [o.error and o.error.splitlines()[0], *o.not_bitten[:2]]))
            lines.append(f"{name}: {label} (exit {o.exit_code}, run {o.run_id}), expected "
                         f"{'XFAIL' if o.xfail else 'passed'}" + (f": {why}" if why else ""))
        elif require_bitten:
            lines += [f"{name}: fault {f} (run {o.run_id})" for f in o.not_bitten]
    return lines


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; see the module doc."""
    args = list(sys.argv[1:] if argv is None else argv)
    require = "--require-bitten" in args
    expected = "--expected" in args
    subset = "--subset" in args
    args = [a for a in args if a not in ("--require-bitten", "--expected", "--subset")]
    if len(args) != 2 and not (expected and args):
        print(__doc__, file=sys.stderr)
        return 2
    got = [load_outcomes(Path(folder)) for folder in args]
    for folder, outcomes in zip(args, got):
        if not outcomes:
            print(f"error: no run (*/result.json) in {folder}", file=sys.stderr)
            return 2
    for folder, outcomes in zip(args, got):
        mixed = len({o.proxy for o in outcomes.values()}) > 1
        print(f"{folder}: proxy {proxies(outcomes)}" + ("  <- more than one proxy in one folder" if mixed else ""))
    if expected:
        total = 0
        for folder, outcomes in zip(args, got):
            lines = false_verdicts(outcomes, require)
            for line in lines:
                print(f"{folder}: {line}")
            print(f"{folder}: {len(outcomes)} scenarios, {len(lines)} false verdict(s)")
            total += len(lines)
        return 1 if total else 0
    a, b = got
    lines = compare(a, b, require, subset)
    for line in lines:
        print(line)
    print(f"{len(set(b) if subset else set(a) | set(b))} scenarios, {len(lines)} difference(s)")
    return 1 if lines else 0


if __name__ == "__main__":
    raise SystemExit(main())
