"""A bounded CPU load generator around a command: ``--procs`` busy-loop processes (default 4,
twice this 2-core machine's cores) run while COMMAND runs, and are ended on every exit
(COMMAND's end, an error, Ctrl-C, SIGTERM) and at ``--max-s`` at the latest.

    python benchmarks/load.py [--procs N] [--max-s S] -- COMMAND [ARGS...]

Exit status: COMMAND's (124 when --max-s ended it). Used by ``make test-loaded`` and
benchmarks/catalogue_under_load.py.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

BUSY = "import os\nos.nice(0)\nwhile True:\n    pass\n"


@contextmanager
def busy_load(procs: int, max_s: float):
    """``procs`` busy-loop processes for the block (each in its own process group, killed by
    pid at the end); a watchdog process kills them after ``max_s`` seconds even if this one
    dies without cleaning up."""
    workers = [subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True,
                                stdin=subprocess.DEVNULL) for _ in range(procs)]
    pids = " ".join(str(w.pid) for w in workers)
    watchdog = subprocess.Popen(["sh", "-c", f"sleep {int(max_s)}; kill -9 {pids} 2>/dev/null"],
                                start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        yield workers
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.wait()
        if watchdog.poll() is None:
            watchdog.kill()
        watchdog.wait()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; see the module doc."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=4, help="busy-loop processes (default 4)")
    ap.add_argument("--max-s", type=float, default=4 * 3600, help="end everything after this long (s)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give a command after --")

    def stop(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    t0 = time.monotonic()
    with busy_load(args.procs, args.max_s):
        print(f"load: {args.procs} busy-loop processes (at most {args.max_s:.0f} s) around: {' '.join(cmd)}",
              file=sys.stderr, flush=True)
        child = subprocess.Popen(cmd)
        try:
            rc = child.wait(timeout=args.max_s)
        except subprocess.TimeoutExpired:
            child.terminate()
            child.wait(60)
            rc = 124
        except KeyboardInterrupt:
            child.send_signal(signal.SIGINT)
            child.wait(300)
            rc = 130
    print(f"load: done in {time.monotonic() - t0:.0f} s, exit {rc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
