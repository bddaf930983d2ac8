#!/usr/bin/env python3
"""`kvchaos validate` on hypothesis mutations of the shipped scenario and stack files, each case
in its own process (forked from a warmed-up one), with a time and a memory bound per case.

    .venv/bin/python scripts/fuzz_validate.py [--scenarios 3000] [--stacks 500] [--markers 500] [--seed 13]
        [--cpu-s 5] [--timeout-s 60] [--memory-mib 200] [--json reports/fuzz/summary.json]

A case fails when `validate` exits other than 0 or 2, prints a traceback, an exit-2 line that
names neither one of the case's files and a line nor a whole-file reason, the text of a canary
file named by ``stack:``, a marker value of a stack file (marker cases), uses more than --cpu-s
CPU seconds of its own or runs longer than --timeout-s of wall time (tests/fuzzing.py
``too_slow``: the wall time alone is the host's load), or peaks above --memory-mib resident
(the child's own ru_maxrss, which includes the interpreter and kvchaos: ~50 MiB). Mutations and
the rule: tests/fuzzing.py. Exit code 0 when no case failed. `make fuzz` runs it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fuzzing  # noqa: E402


def run(kind: str, n: int, args, stats: dict, work_root: Path) -> None:
    strategy = {"scenario": fuzzing.scenario_case, "stack": fuzzing.stack_case,
                "marker": fuzzing.marker_stack_case}[kind]
    rec = stats[kind] = {"cases": 0, "exit_0": 0, "exit_2": 0, "failures": [], "seconds": [], "rss_kib": []}

    @seed(args.seed + {"scenario": 0, "stack": 1, "marker": 2}[kind])
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data):
        work = work_root / kind
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        case = data.draw(strategy(work))
        out = fuzzing.validate_forked(case, timeout_s=args.timeout_s, memory_limit_mib=max(1024, args.memory_mib * 4))
        rec["cases"] += 1
        rec["seconds"].append(out.seconds)
        rec["rss_kib"].append(out.max_rss_kib)
        if out.exit_code in (0, 2):
            rec[f"exit_{out.exit_code}"] += 1
        bad = fuzzing.problems_with(case, out.exit_code, out.output)
        slow = fuzzing.too_slow(out, cpu_s=args.cpu_s, wall_s=args.timeout_s)
        if slow:
            bad.append(slow)
        if out.max_rss_kib > args.memory_mib * 1024:
            bad.append(f"peaked at {out.max_rss_kib / 1024:.0f} MiB resident")
        if bad:
            keep = work_root / "failures" / f"{kind}-{rec['cases']}"
            shutil.copytree(work, keep)
            (keep / "output.txt").write_text(out.output)
            rec["failures"].append({"case": str(keep), "why": bad, "output": out.output[-1500:]})
        if rec["cases"] % 250 == 0:
            print(f"{kind}: {rec['cases']}/{n} cases, {len(rec['failures'])} failing", file=sys.stderr, flush=True)

    one()


def summary(rec: dict) -> dict:
    secs, rss = sorted(rec["seconds"]), sorted(rec["rss_kib"])
    pick = (lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None)
    return {"cases": rec["cases"], "exit_0": rec["exit_0"], "exit_2": rec["exit_2"],
            "failing": len(rec["failures"]),
            "seconds": {"median": statistics.median(secs) if secs else None, "p99": pick(secs, 0.99),
                        "max": secs[-1] if secs else None},
            "rss_mib": {"median": statistics.median(rss) / 1024 if rss else None,
                        "max": rss[-1] / 1024 if rss else None},
            "failures": rec["failures"][:20]}


KINDS = ("scenario", "stack", "marker")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", type=int, default=3000)
    ap.add_argument("--stacks", type=int, default=500)
    ap.add_argument("--markers", type=int, default=500,
                    help="stack files whose values carry marker strings (none may be printed)")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--cpu-s", type=float, default=fuzzing.CASE_CPU_SECONDS)
    ap.add_argument("--timeout-s", type=float, default=fuzzing.CASE_WALL_SECONDS)
    ap.add_argument("--memory-mib", type=int, default=200)
    ap.add_argument("--json", type=Path, default=REPO / "reports" / "fuzz" / "summary.json")
    args = ap.parse_args()
    fuzzing.warm_up()
    stats: dict = {}
    t0 = time.monotonic()
    work_root = Path(tempfile.mkdtemp(prefix="kvchaos-fuzz-"))
    run("scenario", args.scenarios, args, stats, work_root)
    run("stack", args.stacks, args, stats, work_root)
    run("marker", args.markers, args, stats, work_root)
    out = {"seed": args.seed, "wall_s": round(time.monotonic() - t0, 1), "timeout_s": args.timeout_s, "cpu_s": args.cpu_s,
           "memory_mib": args.memory_mib, **{k: summary(v) for k, v in stats.items()}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    for kind in KINDS:
        s = out[kind]
        print(f"{kind} mutations: {s['cases']} cases, exit 0: {s['exit_0']}, exit 2: {s['exit_2']}, failing: "
              f"{s['failing']}; seconds median {s['seconds']['median']:.3f} p99 {s['seconds']['p99']:.3f} max "
              f"{s['seconds']['max']:.3f}; peak RSS median {s['rss_mib']['median']:.0f} MiB max "
              f"{s['rss_mib']['max']:.0f} MiB")
        for f in s["failures"]:
            print(f"  FAIL {f['case']}: {'; '.join(f['why'])}")
    print(f"wall time {out['wall_s']} s; summary: {args.json}; failing cases kept under {work_root}/failures")
    failing = sum(out[k]["failing"] for k in KINDS)
    if not failing:
        shutil.rmtree(work_root, ignore_errors=True)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
