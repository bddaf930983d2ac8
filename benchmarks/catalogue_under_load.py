"""The catalogue's wall time on a quiet and on a loaded machine, and how many verdicts the load
changed (goal: 0). Both runs happen in this one invocation, one after the other, so the ratio
compares like with like on whatever machine this is.

    quiet:  kvchaos run SCENARIOS                       (as the machine is)
    loaded: the same, inside benchmarks/load.py --procs N (N busy-loop processes, default 4,
            twice the cores of the 2-core CI machine), ended when the run ends

Prints the two wall times, their ratio, and each scenario whose verdict or exit code differs
(chaos/report/compare.py). Exit status 0 when no verdict differed, 1 otherwise.

Usage: .venv/bin/python benchmarks/catalogue_under_load.py [--procs 4] [--proxy bundled|real]
       [SCENARIO|FOLDER ...]            (default: scenarios/, about 2 x 8-15 minutes here)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.report.compare import compare, load_outcomes  # noqa: E402


def run(label: str, scenarios: list[str], report_dir: Path, proxy: str | None, load_procs: int) -> float:
    kvchaos = str(Path(sys.executable).with_name("kvchaos"))
    cmd = [kvchaos, "run", *scenarios, "--report-dir", str(report_dir)]
    if proxy:
        cmd += ["--proxy", proxy]
    if load_procs:
        cmd = [sys.executable, str(ROOT / "benchmarks" / "load.py"), "--procs", str(load_procs),
               "--max-s", "7200", "--", *cmd]
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(report_dir.parent / f"state-{label}"))
    t0 = time.monotonic()
    subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="*", default=["scenarios/"])
    ap.add_argument("--procs", type=int, default=4, help="busy-loop processes of the loaded run")
    ap.add_argument("--proxy", choices=["bundled", "real"], default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvchaos-bench-load-") as tmp:
        quiet_dir, loaded_dir = Path(tmp) / "quiet", Path(tmp) / "loaded"
        quiet_s = run("quiet", args.scenarios, quiet_dir, args.proxy, 0)
        loaded_s = run("loaded", args.scenarios, loaded_dir, args.proxy, args.procs)
        quiet, loaded = load_outcomes(quiet_dir), load_outcomes(loaded_dir)
        diffs = compare(quiet, loaded)
    print(f"catalogue: {', '.join(args.scenarios)} ({len(quiet)} scenarios), proxy {args.proxy or 'default'}")
    print(f"quiet  wall time: {quiet_s:8.1f} s   (load average at start as the machine was)")
    print(f"loaded wall time: {loaded_s:8.1f} s   ({args.procs} busy-loop processes)")
    print(f"ratio loaded/quiet: {loaded_s / quiet_s:.2f}")
    for line in diffs:
        print(f"  differs: {line}")
    print(f"verdicts that differed from the quiet run: {len(diffs)} (goal 0)")
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
