"""What diagnosing one failing request adds to a run, as a ratio to the run's own time.

Everything is measured in this one run, on one reused reference stack:

    baseline: scenarios/smoke.yaml with ``--bug store-before-compute``, diagnosis off
    diagnosed: the same scenario and bug, diagnosis of the first failing request on
               (``KVCHAOS_DIAGNOSE=1``), the first time in this process (LMCache's client is
               imported then) and again (warm)
    added = the diagnosis's own wall time (diagnosis.json ``seconds``);
    ratio = added / the baseline run's wall time

Usage: .venv/bin/python benchmarks/diagnose_cost.py [--scenario scenarios/smoke.yaml]
       [--bug store-before-compute] [--runs 2]
Target (issue 14): under 10 s added for one failing request.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.stack.environment import apply_to_current_process  # noqa: E402

apply_to_current_process()
os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

from chaos.runner.run import run_scenario  # noqa: E402
from chaos.runner.stacks import StackPool  # noqa: E402
from chaos.runner.suite import load_and_validate  # noqa: E402
from chaos.stack.base import new_run_id  # noqa: E402


def one(pool: StackPool, path: Path, bug: str, report_dir: Path, diagnose: int) -> dict:
    os.environ["KVCHAOS_DIAGNOSE"] = str(diagnose)
    (scenario,) = load_and_validate([path])
    scenario.engine.bugs = [bug]
    stack = pool.acquire(Path(scenario.stack), scenario.stack_variables())
    run_id = new_run_id("bench-diagnose")
    t0 = time.monotonic()
    result = run_scenario(scenario, stack, report_dir / run_id, run_id=run_id)
    total = time.monotonic() - t0
    pool.release(Path(scenario.stack), result)
    diag_path = report_dir / run_id / "diagnosis.json"
    diag = json.loads(diag_path.read_text()) if diag_path.is_file() else None
    return {"total_s": total, "verdict": result.verdict,
            "diagnose_s": diag["seconds"] if diag else 0.0,
            "diagnosed": [(r["request_id"], r["verdict"], r["kind"], r["seconds"]) for r in (diag or {}).get("requests", [])]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=str(ROOT / "scenarios/smoke.yaml"))
    ap.add_argument("--bug", default="store-before-compute")
    ap.add_argument("--runs", type=int, default=2, help="diagnosed runs (the first pays the import)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvchaos-bench-") as tmp:
        tmp = Path(tmp)
        pool = StackPool("local", tmp / "stacks")
        try:
            base = one(pool, Path(args.scenario), args.bug, tmp, diagnose=0)
            runs = [one(pool, Path(args.scenario), args.bug, tmp, diagnose=1) for _ in range(args.runs)]
        finally:
            pool.close()
    print(f"baseline run (diagnosis off): {base['total_s']:.1f} s, verdict {base['verdict']}")
    worst = 0.0
    for i, r in enumerate(runs):
        added = r["diagnose_s"]
        worst = max(worst, added)
        label = "first (cold: imports LMCache's client)" if i == 0 else "again (warm)"
        print(f"diagnosed run {i + 1} {label}: run {r['total_s']:.1f} s, diagnosis of one request {added:.1f} s "
              f"= {added / base['total_s']:.2f} x the run's own time; {r['diagnosed']}")
    print(f"worst added: {worst:.1f} s (target < 10 s): {'OK' if worst < 10 else 'OVER'}")
    return 0 if worst < 10 else 1


if __name__ == "__main__":
    sys.exit(main())
