#!/usr/bin/env python3
"""SIGINT and SIGTERM sent to `kvchaos run` within its first seconds: each must leave a report.

    .venv/bin/python scripts/startup_signals.py [--count 20] [--window-s 3]
        [--scenario scenarios/smoke.yaml] [--work DIR] [--json reports/startup-signals.json]

For each signal, ``--count`` runs of ``.venv/bin/kvchaos run SCENARIO --report-dir DIR/case-N``
(the console script, as a user starts it), the signal sent at a time spread evenly over the
first ``--window-s`` seconds after the process was started, but never before the entry point
has installed its handler (seen in ``/proc/<pid>/status`` SigCgt: Python itself never catches
SIGTERM, so the bit is kvchaos's; the interpreter's own start-up before that meets Python's
defaults, see chaos/entry.py). A case passes when the run exits 128 + the signal, prints no
traceback, and leaves a suite.json with verdict ``interrupted`` naming that signal and a stage,
and a result.json in every run folder, the last run's (the one the signal met) with verdict
``interrupted`` (a run of a suite that ended before the signal keeps its own verdict:
``run_problems``). Prints one line per case and the counts (per signal, per stage); exit 0 when
every case passed. ``make startup-signals`` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _default_sigint() -> None:
    """The child gets SIGINT's default disposition (a background job of a shell has it ignored,
    and kvchaos keeps an ignored signal ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (SigCgt of /proc/<pid>/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        return False
    return False


def run_problems(reports: Path, runs: list[dict]) -> list[str]:
    """What is wrong with the run folders of an interrupted suite (its suite.json ``runs``, in
    the order they ran, one at a time): each has a result.json; the run the signal met, the last
    one, says ``interrupted``; a run before it may have finished before the signal with its own
    verdict, but none after an interrupted one. Empty when right."""
    if not runs:
        return ["no run report"]
    bad: list[str] = []
    verdicts = []
    for entry in runs:
        result = reports / entry["run_dir"] / "result.json"
        if not result.is_file():
            bad.append(f"no {result.name} in {entry['run_dir']}")
            verdicts.append(None)
        else:
            verdicts.append(json.loads(result.read_text()).get("verdict"))
    if verdicts[-1] not in (None, "interrupted"):
        bad.append(f"{runs[-1]['run_dir']} (the run the signal met): verdict {verdicts[-1]}")
    if "interrupted" in verdicts:
        first = verdicts.index("interrupted")
        bad += [f"{runs[i]['run_dir']}: verdict {v} after an interrupted run"
                for i, v in enumerate(verdicts) if i > first and v not in (None, "interrupted")]
    return bad


def one_case(kvchaos: Path, scenario: Path, work: Path, sig: int, delay_s: float,
             timeout_s: float) -> dict:
    """Start one run, send ``sig`` at ``delay_s`` after the start (not before the handler is
    in), wait for it, and judge what it left."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    reports = work / "reports"
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(work / "state"))
    with open(work / "stdout.txt", "wb") as out, open(work / "stderr.txt", "wb") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen([str(kvchaos), "run", str(scenario), "--report-dir", str(reports)],
                                stdout=out, stderr=err, env=env, cwd=work, preexec_fn=_default_sigint)
        while not catches(proc.pid, signal.SIGTERM) and proc.poll() is None:
            time.sleep(0.001)
        ready_s = time.monotonic() - t0
        wait = t0 + delay_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        sent_s = time.monotonic() - t0
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    stderr = (work / "stderr.txt").read_text(errors="replace")
    stdout = (work / "stdout.txt").read_text(errors="replace")
    bad: list[str] = []
    if code != 128 + sig:
        bad.append(f"exit code {code}, expected {128 + sig}")
    if "Traceback" in stderr or "Traceback" in stdout:
        bad.append("a traceback")
    suites = sorted(reports.glob("*suite*/suite.json")) if reports.is_dir() else []
    stage = None
    if len(suites) != 1:
        bad.append(f"{len(suites)} suite reports")
    else:
        suite = json.loads(suites[0].read_text())
        info = suite.get("interrupted") or {}
        stage = info.get("stage")
        if suite.get("verdict") != "interrupted":
            bad.append(f"suite verdict {suite.get('verdict')}")
        if info.get("signal") != signal.Signals(sig).name or info.get("exit_code") != 128 + sig:
            bad.append(f"suite names {info.get('signal')} / {info.get('exit_code')}")
        if not stage:
            bad.append("no stage")
        bad += run_problems(reports, suite.get("runs", []))
    return {"signal": signal.Signals(sig).name, "delay_s": round(delay_s, 3), "ready_s": round(ready_s, 3),
            "sent_s": round(sent_s, 3), "exit_code": code, "stage": stage, "problems": bad, "dir": str(work)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=20, help="runs per signal (SIGINT, SIGTERM)")
    ap.add_argument("--window-s", type=float, default=3.0, help="signals are sent within this many seconds")
    ap.add_argument("--scenario", type=Path, default=REPO / "scenarios" / "smoke.yaml")
    ap.add_argument("--kvchaos", type=Path, default=REPO / ".venv" / "bin" / "kvchaos")
    ap.add_argument("--work", type=Path, default=REPO / "reports" / "startup-signals")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per run, after the signal")
    ap.add_argument("--json", type=Path, default=None, help="write the cases and counts here")
    args = ap.parse_args()
    cases = []
    for i in range(args.count):
        for sig in (signal.SIGINT, signal.SIGTERM):
            delay = args.window_s * (i + 0.5) / args.count
            case = one_case(args.kvchaos, args.scenario.resolve(), args.work / f"case-{len(cases)}", sig, delay,
                            args.timeout_s)
            cases.append(case)
            print(f"{case['signal']:7} sent at {case['sent_s']:5.2f}s (handler in at {case['ready_s']:.2f}s): "
                  f"exit {case['exit_code']}, stage {case['stage']!r}: "
                  f"{'ok' if not case['problems'] else '; '.join(case['problems'])}", flush=True)
    counts = {
        "cases": len(cases),
        "passed": sum(not c["problems"] for c in cases),
        "by_signal": {name: {"cases": sum(c["signal"] == name for c in cases),
                             "passed": sum(c["signal"] == name and not c["problems"] for c in cases)}
                      for name in ("SIGINT", "SIGTERM")},
        "by_stage": dict(Counter(str(c["stage"]) for c in cases)),
        "sent_before_handler": sum(c["sent_s"] < c["ready_s"] for c in cases),
    }
    print(json.dumps(counts, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"counts": counts, "cases": cases}, indent=2))
    return 0 if counts["passed"] == counts["cases"] else 1


if __name__ == "__main__":
    sys.exit(main())
