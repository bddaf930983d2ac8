"""Per-scenario overhead of the runner on a reused stack vs a fresh stack, and the speedup the
stored recompute oracle gives a second run. Everything is measured in this one run (these
machines are noisy), and printed as ratios next to the raw figures.

    fresh:  start the reference stack, run scenarios/smoke.yaml, stop the stack
    reused: the same pool again: reset the stack (clear caches, reset proxy), run smoke again
    overhead = wall time of a scenario - time its workload ran (stack start/reset, quiesce,
               oracle, checks, report)
    oracle: expected outputs for one history, asked from the twin (empty store) vs read back

Usage: .venv/bin/python benchmarks/suite_overhead.py [--scenario scenarios/smoke.yaml] [--runs 2]
Target (issue 5): reuse overhead under 5 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.stack.environment import apply_to_current_process  # noqa: E402

apply_to_current_process()

from chaos.history import load_history  # noqa: E402
from chaos.oracle import RecomputeOracle  # noqa: E402
from chaos.runner.run import run_scenario  # noqa: E402
from chaos.runner.stacks import StackPool  # noqa: E402
from chaos.runner.suite import load_and_validate  # noqa: E402
from chaos.stack.base import new_run_id  # noqa: E402


def one(pool: StackPool, scenario, report_dir: Path) -> dict:
    t0 = time.monotonic()
    stack = pool.acquire(Path(scenario.stack), scenario.stack_variables())
    setup = time.monotonic() - t0
    run_id = new_run_id("bench-" + scenario.name)
    result = run_scenario(scenario, stack, report_dir / run_id, run_id=run_id)
    total = time.monotonic() - t0
    workload = result.stats.workload_s or 0.0
    return {"total_s": total, "setup_s": setup, "workload_s": workload, "overhead_s": total - workload,
            "verdict": result.verdict, "run_dir": report_dir / run_id}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=str(ROOT / "scenarios/smoke.yaml"))
    ap.add_argument("--runs", type=int, default=2, help="reused-stack runs after the fresh one")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvchaos-bench-") as tmp:
        tmp = Path(tmp)
        os.environ["KVCHAOS_ORACLE_DIR"] = str(tmp / "oracle")
        scenario = load_and_validate([Path(args.scenario)])[0]
        pool = StackPool("local", tmp / "stacks")
        try:
            fresh = one(pool, scenario, tmp / "reports")
            reused = [one(pool, scenario, tmp / "reports") for _ in range(args.runs)]
            # Oracle: the same history, asked from the twin with an empty store, then read back.
            history = load_history(fresh["run_dir"] / "history.jsonl")
            url = pool._stacks[Path(scenario.stack).resolve()].settings.recompute_url
            t0 = time.monotonic()
            cold = RecomputeOracle(url, directory=tmp / "oracle-cold")
            cold.expected_for(history)
            cold_s = time.monotonic() - t0
            t0 = time.monotonic()
            warm = RecomputeOracle(url, directory=tmp / "oracle-cold")
            warm.expected_for(history)
            warm_s = time.monotonic() - t0
            asked, stored = cold.misses, warm.hits
        finally:
            pool.close()
    best_reuse = min(r["overhead_s"] for r in reused)
    print(f"scenario: {scenario.name}")
    print(f"fresh stack : total {fresh['total_s']:6.2f}s  setup {fresh['setup_s']:6.2f}s  "
          f"workload {fresh['workload_s']:5.2f}s  overhead {fresh['overhead_s']:6.2f}s  ({fresh['verdict']})")
    for i, r in enumerate(reused):
        print(f"reused #{i + 1}   : total {r['total_s']:6.2f}s  setup {r['setup_s']:6.2f}s  "
              f"workload {r['workload_s']:5.2f}s  overhead {r['overhead_s']:6.2f}s  ({r['verdict']})")
    print(f"reuse overhead (best) {best_reuse:.2f}s  target < 5s: {'met' if best_reuse < 5 else 'MISSED'}")
    print(f"overhead ratio fresh/reused: {fresh['overhead_s'] / best_reuse:.1f}x")
    print(f"oracle: {asked} prompts asked from the twin in {cold_s:.2f}s; {stored} read back in "
          f"{warm_s:.3f}s; speedup {cold_s / max(warm_s, 1e-6):.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
