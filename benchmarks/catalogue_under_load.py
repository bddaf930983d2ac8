"""The catalogue's wall time on a quiet and on a loaded machine, and how many verdicts the load
changed (goal: 0). Both runs happen in this one invocation, one after the other, so the ratio
compares like with like on whatever machine this is.

    quiet:  kvchaos run SCENARIOS                       (as the machine is)
    loaded: the same, inside benchmarks/load.py --procs N (N busy-loop processes, default 4,
            twice the cores of the 2-core CI machine), ended when the run ends

Prints the two wall times, their ratio, the load average after each run, each scenario whose
verdict or exit code differs (chaos/report/compare.py), and each verdict of either run that is
not the catalogue's expectation (a clean scenario not passed, a finding not XFAIL). Both runs'
reports are kept in ``--out`` (default reports/bench-load/{quiet,loaded}) to look into a
difference. Exit status 0 when no verdict differed, 1 otherwise.

Usage: .venv/bin/python benchmarks/catalogue_under_load.py [--procs 4] [--proxy bundled|real]
       [--out DIR] [SCENARIO|FOLDER ...]   (default: scenarios/, about 15 + 30 minutes here)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.report.compare import compare, false_verdicts, load_outcomes  # noqa: E402


def run(label: str, scenarios: list[str], report_dir: Path, proxy: str | None, load_procs: int) -> float:
    """Run ``kvchaos run SCENARIOS`` into ``report_dir`` (under ``load_procs`` busy loops when
    not 0), with a state dir of its own; returns its wall time in seconds."""
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
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench-load",
                    help="where both runs' reports are kept (emptied first)")
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    quiet_dir, loaded_dir = args.out / "quiet", args.out / "loaded"
    quiet_s = run("quiet", args.scenarios, quiet_dir, args.proxy, 0)
    quiet_load = os.getloadavg()[0]
    loaded_s = run("loaded", args.scenarios, loaded_dir, args.proxy, args.procs)
    loaded_load = os.getloadavg()[0]
    quiet, loaded = load_outcomes(quiet_dir), load_outcomes(loaded_dir)
    diffs = compare(quiet, loaded)
    print(f"catalogue: {', '.join(args.scenarios)} ({len(quiet)} scenarios), proxy {args.proxy or 'default'}")
    print(f"quiet  wall time: {quiet_s:8.1f} s   (1-min load average at its end {quiet_load:.1f})")
    print(f"loaded wall time: {loaded_s:8.1f} s   ({args.procs} busy-loop processes; load average at its end "
          f"{loaded_load:.1f})")
    print(f"ratio loaded/quiet: {loaded_s / quiet_s:.2f}")
    for line in diffs:
        print(f"  differs: {line}")
    for label, outcomes in (("quiet", quiet), ("loaded", loaded)):
        for line in false_verdicts(outcomes):
            print(f"  not as the catalogue expects ({label}): {line}")
    print(f"verdicts that differed from the quiet run: {len(diffs)} (goal 0); reports in {args.out}")
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
