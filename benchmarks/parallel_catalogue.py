"""The catalogue's wall time serial and with ``--jobs N`` (default 3), their ratio, and how many
verdicts differ (goal: ratio at most 0.5 on two cores, 0 verdicts differing). Both runs happen in
this one invocation, one after the other, so the ratio compares like with like on whatever
machine this is; ``--repeat K`` does the pair K times.

    serial:   kvchaos run SCENARIOS --jobs 1
    parallel: kvchaos run SCENARIOS --jobs N        (chaos/campaign.py: N workers, a stack each)

Prints, per repetition, the two wall times, their ratio and the number of scenarios whose
verdict or exit code differs (chaos/report/compare.py), each difference named, then the worst
ratio and the total of differing verdicts. Reports are kept under ``--out`` (default
reports/bench-parallel/<rep>/{serial,parallel}). Exit status 0 when no verdict differed.

Usage: .venv/bin/python benchmarks/parallel_catalogue.py [--jobs 3] [--repeat 3] [--out DIR]
       [--scenarios NAME ...] [SCENARIO|FOLDER ...]
       (default: scenarios/, about 15 min serial + the parallel run, per repetition, here;
       ``--scenarios smoke lookup-timeout`` picks scenarios/<name>.yaml for a short check)
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

from chaos.report.compare import compare, load_outcomes  # noqa: E402


def run(scenarios: list[str], jobs: int, report_dir: Path) -> tuple[float, int]:
    """``kvchaos run SCENARIOS --jobs JOBS`` into ``report_dir`` with a state dir of its own;
    returns (wall time in seconds, exit code)."""
    kvchaos = str(Path(sys.executable).with_name("kvchaos"))
    cmd = [kvchaos, "run", *scenarios, "--jobs", str(jobs), "--report-dir", str(report_dir)]
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(report_dir.parent / f"state-{report_dir.name}"))
    t0 = time.monotonic()
    rc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    return time.monotonic() - t0, rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="scenario files or folders (default scenarios/)")
    ap.add_argument("--scenarios", nargs="+", default=[], metavar="NAME",
                    help="catalogue scenarios by name (scenarios/NAME.yaml)")
    ap.add_argument("--jobs", type=int, default=3, help="workers of the parallel run")
    ap.add_argument("--repeat", type=int, default=1, help="serial + parallel pairs to run")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench-parallel",
                    help="where every run's reports are kept (emptied first)")
    args = ap.parse_args()
    scenarios = list(args.paths) + [f"scenarios/{n}.yaml" for n in args.scenarios] or ["scenarios/"]
    missing = [s for s in scenarios if not (ROOT / s).exists() and not Path(s).exists()]
    if missing:
        print(f"error: no such scenario: {', '.join(missing)}", file=sys.stderr)
        return 2
    shutil.rmtree(args.out, ignore_errors=True)
    print(f"catalogue: {', '.join(scenarios)}; --jobs {args.jobs}; {os.cpu_count()} cores; "
          f"{args.repeat} repetition(s)")
    ratios, differing = [], 0
    for rep in range(1, args.repeat + 1):
        base = args.out / str(rep)
        serial_s, serial_rc = run(scenarios, 1, base / "serial")
        parallel_s, parallel_rc = run(scenarios, args.jobs, base / "parallel")
        serial, parallel = load_outcomes(base / "serial"), load_outcomes(base / "parallel")
        diffs = compare(serial, parallel)
        if serial_rc != parallel_rc:
            diffs.append(f"exit code: serial {serial_rc}, --jobs {args.jobs} {parallel_rc}")
        ratios.append(parallel_s / serial_s)
        differing += len(diffs)
        print(f"[{rep}] {len(serial)} scenarios: serial wall time {serial_s:7.1f} s (exit {serial_rc}), "
              f"--jobs {args.jobs} wall time {parallel_s:7.1f} s (exit {parallel_rc}), "
              f"ratio {parallel_s / serial_s:.2f}, verdicts that differ: {len(diffs)}")
        for line in diffs:
            print(f"    differs: {line}")
    print(f"worst ratio --jobs {args.jobs}/serial: {max(ratios):.2f} (goal at most 0.5); verdicts that differed: "
          f"{differing} (goal 0); reports in {args.out}")
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
