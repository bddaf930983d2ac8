#!/usr/bin/env python3
"""Mutation score of the catalogue against the engine's scheduler and LMCache connector.

A sample (seeded) of small source changes to chaos/engine/scheduler.py and connector.py, each
on a line the catalogue reaches (docs/coverage.json), each run against only the scenarios
whose coverage record reaches that line, on the clean row of the zoo (chaos.zoo.run_zoo):

    docs/coverage.json ──> reached lines + their scenarios ──> candidate mutants
       (operator swaps: < <=, == !=, and or, +1 -1, a call statement removed)
    sample N ──> for each: write the mutant in place ──> run_zoo(clean row, its scenarios)
             ──> killed (a scenario did not pass) | survived; the source is restored on every
                 exit (an exception, Ctrl-C, SIGTERM)

Bounded and slow (one stack per mutant, ~1-4 min each): `make mutation-engine` (nightly),
not CI. Prints each mutant (file:line, before/after) with its verdict and the score.

Exit codes: 0 done (whatever the score), 2 bad arguments or no measurement.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chaos.coverage import ENGINE_FILES, SUMMARY_PATH  # noqa: E402

#: (pattern, replacement): the first match on the line is replaced.
OPERATORS: list[tuple[str, str]] = [
    (r" <= ", " < "), (r" < ", " <= "), (r" >= ", " > "), (r" > ", " >= "),
    (r" == ", " != "), (r" != ", " == "), (r" and ", " or "), (r" or ", " and "),
    (r"\bnot ", ""), (r" \+ 1\b", " - 1"), (r" - 1\b", " + 1"), (r"\bTrue\b", "False"),
]
#: A call statement of the connector's clean-up API, removed (the class of a missed free).
REMOVABLE = re.compile(r"^\s*(conn|self\.connector|self)\.(free_locks|end_request|forget_lookup|_store|"
                       r"_free_unknown_locks|_register_prefix)\(")


def reached_lines(summary: dict) -> dict[tuple[str, int], list[str]]:
    """(file key, line) -> scenarios whose record ran a branch from or into that line."""
    out: dict[tuple[str, int], set[str]] = {}
    for b in summary["branches"]:
        for line in (b["from"], b["to"]):
            if line > 0 and b["scenarios"]:
                out.setdefault((b["file"], line), set()).update(b["scenarios"])
    return {k: sorted(v) for k, v in out.items()}


def candidates(summary: dict) -> list[dict]:
    """Every mutant of a reached line: {file, line, before, after, scenarios}."""
    import ast

    found = []
    for (key, line), scen in sorted(reached_lines(summary).items()):
        path = ROOT / ENGINE_FILES[key]
        lines = path.read_text().splitlines()
        if line > len(lines):
            continue
        text = lines[line - 1]
        code = text.split("#")[0]
        variants = []
        for pat, rep in OPERATORS:
            m = re.search(pat, code)
            if m:
                variants.append(text[:m.start()] + re.sub(pat, rep, text[m.start():], count=1))
        if REMOVABLE.match(code) and code.rstrip().endswith(")"):
            variants.append(re.match(r"^\s*", text).group(0) + "pass  # mutant: call removed")
        for after in variants:
            trial = lines[:line - 1] + [after] + lines[line:]
            try:
                ast.parse("\n".join(trial))
            except SyntaxError:
                continue
            found.append({"file": key, "line": line, "before": text.strip(), "after": after.strip(),
                          "scenarios": scen})
    return found


def run_mutant(mutant: dict, catalogue: Path, report_dir: Path, max_scenarios: int) -> dict:
    """Apply one mutant in place, run its scenarios on the clean row, restore the source."""
    from chaos.scenario.loader import discover_scenarios
    from chaos.runner.suite import load_and_validate
    from chaos.zoo import CLEAN, run_zoo

    path = ROOT / ENGINE_FILES[mutant["file"]]
    original = path.read_text()
    lines = original.splitlines(keepends=True)
    indent = re.match(r"^\s*", lines[mutant["line"] - 1]).group(0)
    lines[mutant["line"] - 1] = indent + mutant["after"] + "\n"
    names = mutant["scenarios"][:max_scenarios]
    paths = [p for p, s in zip(discover_scenarios(catalogue), load_and_validate(discover_scenarios(catalogue)))
             if s.name in names]
    t0 = time.monotonic()
    try:
        path.write_text("".join(lines))
        matrix = run_zoo(paths, {CLEAN: names}, report_dir=report_dir)
    finally:
        path.write_text(original)
    cells = {n: matrix.cell(CLEAN, n) for n in names}
    killed = any(c not in ("passed", "xfail") for c in cells.values())
    return {**mutant, "ran": names, "cells": cells, "killed": killed,
            "seconds": round(time.monotonic() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=8, help="mutants to run (default 8)")
    ap.add_argument("--seed", type=int, default=17, help="sampling seed")
    ap.add_argument("--max-scenarios", type=int, default=3, help="scenarios per mutant (default 3)")
    ap.add_argument("--catalogue", type=Path, default=ROOT / "scenarios")
    ap.add_argument("--summary", type=Path, default=SUMMARY_PATH, help="the coverage measurement")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "mutation-engine")
    ap.add_argument("--list", action="store_true", help="only list the sampled mutants")
    args = ap.parse_args()
    if not args.summary.exists():
        print(f"error: {args.summary} missing; run `make coverage` first", file=sys.stderr)
        return 2
    pool = candidates(json.loads(args.summary.read_text()))
    sample = random.Random(args.seed).sample(pool, min(args.sample, len(pool)))
    print(f"{len(pool)} candidate mutants on reached lines; sampling {len(sample)} (seed {args.seed})")
    if args.list:
        for m in sample:
            print(f"  {m['file']}.py:{m['line']}: {m['before']}  ->  {m['after']}  [{', '.join(m['scenarios'][:3])}]")
        return 0

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_term)
    args.out.mkdir(parents=True, exist_ok=True)
    done = []
    for k, m in enumerate(sample, 1):
        print(f"[{k}/{len(sample)}] {m['file']}.py:{m['line']}: {m['before']}  ->  {m['after']}", flush=True)
        r = run_mutant(m, args.catalogue, args.out / "runs", args.max_scenarios)
        done.append(r)
        print(f"    {'killed' if r['killed'] else 'SURVIVED'} by {r['cells']} ({r['seconds']}s)", flush=True)
        (args.out / "results.json").write_text(json.dumps(done, indent=1) + "\n")
    killed = sum(r["killed"] for r in done)
    print(f"engine mutation score (sample): {killed}/{len(done)} killed "
          f"({100.0 * killed / max(1, len(done)):.0f}%); {args.out / 'results.json'}")
    for r in done:
        if not r["killed"]:
            print(f"  survived: {r['file']}.py:{r['line']}: {r['before']} -> {r['after']} (ran {', '.join(r['ran'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
