#!/usr/bin/env python3
"""Kill a real `kvchaos run` at random points with SIGTERM, SIGINT and SIGKILL and count what
each left behind (processes, mounts, ports, journal entries, toxics).

    .venv/bin/python scripts/kill_points.py [--scenario scenarios/lookup-timeout.yaml]
        [--each 20] [--seed 13] [--pre 2] [--json reports/killpoints/summary.json]

First one full run measures how long the run lasts from the moment the suite starts preparing
the stack (stack start-up included) to its exit; then --each points per signal are drawn
uniformly over that span, plus --pre points per signal in the interpreter's own start-up
(before the suite starts: nothing can be reported there, and before kvchaos's handler is
installed the signal's default action ends the interpreter, which the shell also reports as
128 + N; the check is exit code and leftovers). SIGTERM / SIGINT: the run must exit 143 / 130, write its report (result.json, the
suite report) and leave nothing, with no cleanup call. SIGKILL: `kvchaos cleanup` with the run's
private KVCHAOS_STATE_DIR must leave nothing. Each run has its own state and report folder.
Exit 0 when every point held. Leftover detection: tests/killpoints.py. `make killpoints`.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from killpoints import Point, kill_point, random_points  # noqa: E402

STARTED = "preparing the stack"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", type=Path, default=REPO / "scenarios" / "lookup-timeout.yaml")
    ap.add_argument("--each", type=int, default=20)
    ap.add_argument("--pre", type=int, default=2)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--total-s", type=float, default=None, help="span to draw points from (default: measured)")
    ap.add_argument("--json", type=Path, default=REPO / "reports" / "killpoints" / "summary.json")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kvchaos-killpoints-"))
    t0 = time.monotonic()
    total = args.total_s
    if total is None:
        work = root / "full"
        out = kill_point(args.scenario, Point(signal.SIGTERM, 100_000.0, STARTED), work, timeout_s=1800)
        if out.returncode != 0 or not out.clean():
            print(f"the full run did not pass cleanly (exit {out.returncode}, leftovers {out.leftovers}):\n"
                  f"{out.output}", file=sys.stderr)
            return 2
        result = json.loads(next(p for p in (work / "reports").glob("*/result.json")
                                 if not p.parent.name.startswith("suite-")).read_text())
        total = float(result["durations"].get("stack_up_s") or 0) + float(result["durations"]["total_s"]) + 5.0
        print(f"full run: exit 0, {total:.1f} s from preparing the stack to the end (+5 s of teardown)",
              file=sys.stderr)
    points = random_points(args.each, total, args.seed, STARTED)
    rng = random.Random(args.seed)
    points += [Point(sig, round(rng.uniform(0.05, 1.0), 2)) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL)
               for _ in range(args.pre)]
    rng.shuffle(points)
    rows, void = [], []
    queue = list(points)
    i = 0
    while queue:
        point = queue.pop(0)
        out = kill_point(args.scenario, point, root / f"point-{i:03d}", timeout_s=1800)
        i += 1
        pre = point.after is None
        if out.sent_at_s is None and len(void) < len(points):
            # The run ended before the signal: done already (the host got faster than when the
            # span was measured), or for a reason of its own (on a shared host: a port another
            # stack took between check and bind, exit 3). Not a kill point; draw again.
            void.append({"signal": point.sig.name, "at_s": point.delay_s, "exit": out.returncode,
                         "error": (out.output or "")[-400:]})
            if out.returncode == 0 and not pre:
                total = max(5.0, min(total, 0.9 * point.delay_s))  # runs are shorter now
            queue.append(Point(point.sig, round(rng.uniform(0, total if not pre else 1.0), 2), point.after))
            print(f"[void] {point.sig.name} at {point.delay_s:.2f}s: the run ended (exit {out.returncode}) "
                  "before the signal; drawn again", file=sys.stderr, flush=True)
            continue
        want_rc = {-signal.SIGKILL} if point.sig == signal.SIGKILL else {128 + point.sig}
        if pre:  # before kvchaos's handler exists the signal's default action ends it (the shell: 128+N)
            want_rc.add(-point.sig)
        ok_rc = out.returncode in want_rc or (out.sent_at_s is None and out.returncode == 0)
        report_needed = point.sig != signal.SIGKILL and not pre and out.sent_at_s is not None
        ok = ok_rc and out.clean() and (not report_needed or out.report) and (
            point.sig != signal.SIGKILL or out.cleanup_rc in (0, None))
        rows.append({"signal": point.sig.name, "at_s": point.delay_s, "before_suite": pre,
                     "sent": out.sent_at_s is not None, "exit": out.returncode, "report": out.report,
                     "verdict": out.verdict, "stage": out.stage, "cleanup_exit": out.cleanup_rc,
                     "leftovers": {k: len(v) for k, v in out.leftovers.items()},
                     "leftover_detail": {k: v for k, v in out.leftovers.items() if v},
                     "ports_taken_by_others": out.ports_taken, "ok": ok,
                     "output": None if ok else out.output[-3000:]})
        print(f"[{len(rows)}/{len(points)}] {point.sig.name} at {point.delay_s:.2f}s{' (pre-suite)' if pre else ''}: "
              f"exit {out.returncode}, report {out.report} ({out.verdict}, {out.stage}), "
              f"leftovers {sum(len(v) for v in out.leftovers.values())}{'' if ok else '  <-- FAILED'}",
              file=sys.stderr, flush=True)
    by_sig = collections.defaultdict(lambda: collections.Counter())
    for r in rows:
        c = by_sig[r["signal"] + (" (pre-suite)" if r["before_suite"] else "")]
        c["runs"] += 1
        c["ok"] += r["ok"]
        c["reports"] += r["report"]
        c["signal_after_exit"] += not r["sent"]
        for k, v in r["leftovers"].items():
            c[f"leftover_{k}"] += v
        if r["stage"]:
            c[f"stage: {r['stage']}"] += 1
    summary = {"scenario": str(args.scenario), "span_s": round(total, 1), "seed": args.seed,
               "wall_s": round(time.monotonic() - t0, 1), "by_signal": {k: dict(v) for k, v in by_sig.items()},
               "void": void, "points": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2) + "\n")
    for k, v in summary["by_signal"].items():
        print(f"{k}: " + ", ".join(f"{a}={b}" for a, b in sorted(v.items())))
    failed = [r for r in rows if not r["ok"]]
    print(f"{len(rows) - len(failed)}/{len(rows)} points held ({len(void)} void: the run ended before the "
          f"signal, drawn again); wall {summary['wall_s']} s; {args.json}")
    if not failed:
        subprocess.run(["rm", "-rf", str(root)], check=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
