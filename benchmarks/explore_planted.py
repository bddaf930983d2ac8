"""Runs and minutes to explore's first finding, per planted reference-engine bug (issue 33,
acceptance 1), the catalogue not used.

For each seed (outermost, so that a cut-off still leaves one full row per bug for the seeds
done) and each planted bug (chaos/engine/bugs.py ``BUGS``, or ``--bugs``), one exploration at a
time::

    kvchaos explore --stack compose/reference.yml --bug B --seed S --budget 6m --jobs 1
        --stop-on-finding --shrink-budget 0 --diagnose 1 --out TMP

then reads its ``summary.json``: the first signature the clean-engine control attributed to the
bug (``attributed_to_bug``, not ``known``). *runs*: its ``first_run_index`` plus one; *minutes*:
its ``first_elapsed_s`` (from the exploration's start, the stack's start included, to the end of
that run; the control run after it is not included) / 60. A seed that found nothing counts as
more than its budget in the median (docs/explore.md "Acceptance 1").

After every exploration the table so far is printed (markdown) and each row appended to
``OUT/rows.jsonl``, with the 1-minute load average at the start and end of the exploration.

Usage: .venv/bin/python benchmarks/explore_planted.py [--budget 6m] [--seeds 1 2 3]
       [--bugs B ...] [--stop-by HH:MM] [--out DIR]
``--stop-by HH:MM`` (UTC): start no exploration that could not end by then (budget plus the
stack's start and the control, about 3 minutes).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.duration import parse_duration  # noqa: E402
from chaos.engine.bugs import BUGS  # noqa: E402

#: Seconds an exploration may run past its budget: the run under way finishes, then the
#: clean-engine control of a finding, the stack's start and stop (measured: 1-3 minutes on the
#: shared 2-core host).
OVERRUN_S = 240.0


def first_finding(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The earliest signature of an exploration that the clean-engine control attributed to the
    planted bug and that no shipped finding matched.

    Args:
        summary: an exploration's summary.json content (chaos/explore/explore.py
            ``ExploreSummary.as_dict``).

    Returns:
        ``{"runs": first_run_index + 1, "minutes": first_elapsed_s / 60, "signature": text}``,
        or None when no such signature was found.
    """
    hits = [g for g in summary.get("signatures", []) if g.get("attributed_to_bug") and not g.get("known")]
    if not hits:
        return None
    g = min(hits, key=lambda s: s["first_run_index"])
    return {"runs": g["first_run_index"] + 1, "minutes": round(g["first_elapsed_s"] / 60.0, 1),
            "signature": g["signature"]}


def median_of(rows: list[dict[str, Any]], key: str) -> float | None:
    """Median of ``key`` over ``rows``, a row that found nothing counting as infinitely many
    (it did not find it within its budget); None when no row has a value and none missed.

    Args:
        rows: rows of one bug, each with ``found`` (bool) and, when found, ``key``.
        key: ``runs`` or ``minutes``.

    Returns:
        The median (``inf`` when most rows found nothing), or None for no rows.
    """
    values = [r[key] if r["found"] else float("inf") for r in rows]
    return statistics.median(values) if values else None


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of ``rows`` (one per exploration) with one median line per bug."""
    out = ["| planted bug | seed | runs | minutes | signature | load 1 min (start / end) |",
           "|---|---|---|---|---|---|"]
    bugs = list(dict.fromkeys(r["bug"] for r in rows))
    for bug in bugs:
        mine = [r for r in rows if r["bug"] == bug]
        for r in mine:
            load = f"{r['load_start']:.1f} / {r['load_end']:.1f}"
            if r["found"]:
                out.append(f"| {bug} | {r['seed']} | {r['runs']} | {r['minutes']} | `{r['signature']}` | {load} |")
            else:
                out.append(f"| {bug} | {r['seed']} | - | - | not found: {r['run_count']} runs, "
                           f"{r['elapsed_s'] / 60:.1f} min ({r['stopped_by']}; exit {r['exit']}) | {load} |")
        found = sum(1 for r in mine if r["found"])
        runs, minutes = median_of(mine, "runs"), median_of(mine, "minutes")

        def show(v: float | None) -> str:
            return "-" if v is None or v == float("inf") else f"{v:g}"

        out.append(f"| **{bug}** | **median of {len(mine)}** | **{show(runs)}** | **{show(minutes)}** | "
                   f"found with {found} of {len(mine)} seeds | |")
    return "\n".join(out)


def explore_once(bug: str, seed: int, budget: str, out: Path, extra: list[str]) -> dict[str, Any]:
    """Run one exploration (its own process group; SIGTERM past budget + OVERRUN_S: explore heals,
    stops its stacks and still writes the summary) and return its table row."""
    folder = out / f"{bug}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [str(ROOT / ".venv/bin/kvchaos"), "explore", "--stack", str(ROOT / "compose/reference.yml"),
           "--bug", bug, "--seed", str(seed), "--budget", budget, "--jobs", "1", "--stop-on-finding",
           "--shrink-budget", "0", "--diagnose", "1", "--out", str(folder), *extra]
    load_start = os.getloadavg()[0]
    t0 = time.monotonic()
    with open(folder / "explore.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=parse_duration(budget) + OVERRUN_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            rc = proc.wait()
    wall = time.monotonic() - t0
    summaries = sorted(folder.glob("*/summary.json"))
    summary = json.loads(summaries[-1].read_text()) if summaries else {}
    hit = first_finding(summary)
    row = {"bug": bug, "seed": seed, "exit": rc, "wall_s": round(wall, 1), "found": hit is not None,
           "run_count": summary.get("run_count", 0), "elapsed_s": summary.get("elapsed_s", wall),
           "stopped_by": summary.get("stopped_by", "no summary"), "load_start": load_start,
           "load_end": os.getloadavg()[0], "summary": str(summaries[-1]) if summaries else None}
    if hit:
        row.update(hit)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", default="6m", help="each exploration's --budget")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--bugs", nargs="+", default=sorted(BUGS), help="planted bugs (default: all)")
    ap.add_argument("--stop-by", default=None, help="HH:MM UTC: start no exploration that could not end by then")
    ap.add_argument("--out", type=Path, default=None, help="folder of the explorations (default: a temp dir)")
    ap.add_argument("extra", nargs="*", help="more kvchaos explore options, after --")
    args = ap.parse_args()
    unknown = [b for b in args.bugs if b not in BUGS]
    if unknown:
        ap.error(f"unknown bug(s) {unknown}; known: {sorted(BUGS)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="explore-planted-"))
    out.mkdir(parents=True, exist_ok=True)
    stop_by = None
    if args.stop_by:
        hh, mm = (int(x) for x in args.stop_by.split(":"))
        now = dt.datetime.now(dt.timezone.utc)
        stop_by = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    rows: list[dict[str, Any]] = []
    for seed in args.seeds:
        for bug in args.bugs:
            if stop_by is not None:
                left = (stop_by - dt.datetime.now(dt.timezone.utc)).total_seconds()
                if left < parse_duration(args.budget) + 180:
                    print(f"stop-by {args.stop_by} UTC: not starting {bug} seed {seed}", flush=True)
                    print(table(rows), flush=True)
                    return 0
            print(f"== {bug} seed {seed} ({dt.datetime.now(dt.timezone.utc):%H:%M:%S} UTC)", flush=True)
            row = explore_once(bug, seed, args.budget, out, args.extra)
            rows.append(row)
            with open(out / "rows.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            print(table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
