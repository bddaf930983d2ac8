"""A bounded CPU load generator around a command: ``--procs`` busy-loop processes (default 4,
twice this 2-core machine's cores) run while COMMAND runs, and are ended on every exit
(COMMAND's end, an error, Ctrl-C, SIGTERM) and at ``--max-s`` at the latest (each loop ends
itself then, even if this script was SIGKILLed). COMMAND runs in a process group of its own, and
a SIGINT or SIGTERM sent to this script alone (``kill -INT PID``, a CI runner that signals only
its top process) reaches that whole group as SIGINT, as a terminal's Ctrl-C would. A member of
the group that ignores SIGINT (a background job of a non-interactive shell: ``sh -c 'a & b &
wait'``, where POSIX shells start ``a`` and ``b`` with SIGINT ignored) gets SIGTERM instead, and
the script waits for the whole group, not COMMAND alone, before the loops end.

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
from pathlib import Path

#: One busy loop that ends itself after ``argv[1]`` seconds (time.monotonic), so the load is
#: bounded even when this process dies without cleaning up (SIGKILL, a lost CI runner).
BUSY = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def busy_load(procs: int, max_s: float):
    """``procs`` busy-loop processes for the block, each in its own process group, killed by pid
    at the end and ending themselves after ``max_s`` seconds in any case.

    No watchdog process: an earlier ``sh -c "sleep N; kill -9 PIDS"`` watchdog outlived the
    block (killing ``sh`` left its ``sleep`` running, holding the caller's stdout: a test that
    captured this script's output waited the whole ``--max-s``), and would have sent SIGKILL to
    pids reused by then. Every worker has stdin/stdout/stderr off the caller's pipes.
    """
    workers = [subprocess.Popen([sys.executable, "-c", BUSY, str(float(max_s))], start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(procs)]
    try:
        yield workers
    finally:
        # A second SIGINT/SIGTERM must not cut this short (it did: 2 of 4 loops outlived a
        # SIGTERMed `make catalogue-loaded` by hours): signals wait until every loop is ended.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for w in workers:
                if w.poll() is None:
                    w.kill()
            for w in workers:
                w.wait()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _signal_group(child: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to COMMAND's process group (its pid is the group id: ``process_group=0``).

    The whole group, not COMMAND alone: GNU make, on SIGINT or SIGTERM, waits for its running
    recipes without signalling them (it counts on the terminal signalling the whole foreground
    group), so a `make test` signalled alone ran on for as long as its pytest did."""
    try:
        os.killpg(child.pid, signum)
    except ProcessLookupError:  # the group is gone: everything in it has ended
        pass


def _members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group ``pgid``, read from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        # after the command name in parentheses: state, ppid, pgrp (proc(5))
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out


def _ignores(pid: int, signum: int) -> bool:
    """Whether process ``pid`` ignores ``signum`` (the SigIgn mask of /proc/PID/status, proc(5))."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False


def _end(child: subprocess.Popen, signum: int, grace_s: float, rc: int) -> int:
    """Send ``signum`` to COMMAND's process group (SIGTERM to a member that ignores it), wait up
    to ``grace_s`` seconds for COMMAND and every member of its group, then SIGKILL what is left;
    returns ``rc``.

    The group, not COMMAND alone: the input that showed it was ``load.py --procs 8 -- sh -c 'for
    i in 1 2 3; do kvchaos run ... & done; wait'`` stopped with SIGINT (2026-12-07): ``sh`` ended
    at once, the script ended the loops and exited 130, and the three ``kvchaos run``, started
    by ``sh`` with SIGINT ignored, ran on unloaded and unsignalled.
    """
    _signal_group(child, signum)
    if signum != signal.SIGTERM:
        for pid in _members(child.pid):
            if _ignores(pid, signum):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + grace_s
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    while _members(child.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if child.poll() is None or _members(child.pid):
        _signal_group(child, signal.SIGKILL)
        child.wait()
    return rc


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

    # SIGINT and SIGTERM only set a flag, read between waits: a handler that raised could land
    # anywhere, also at the start of busy_load's clean-up before it blocks signals, and leave
    # loops running (a burst of SIGTERMs did, on a loaded host).
    stopped: list[str] = []

    def stop(signum, _frame):
        stopped.append(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    t0 = time.monotonic()
    with busy_load(args.procs, args.max_s):
        print(f"load: {args.procs} busy-loop processes (at most {args.max_s:.0f} s) around: {' '.join(cmd)}",
              file=sys.stderr, flush=True)
        # Its own process group, so that a signal for it reaches every process it started. That
        # group is not a terminal's foreground group: a read from the terminal would stop it
        # (SIGTTIN) for good, so a terminal on stdin is replaced by /dev/null.
        stdin = subprocess.DEVNULL if sys.stdin is not None and sys.stdin.isatty() else None
        child = subprocess.Popen(cmd, process_group=0, stdin=stdin)
        rc = None
        while rc is None:
            if stopped:
                rc = _end(child, signal.SIGINT, 300, 130)
            elif time.monotonic() - t0 > args.max_s:
                rc = _end(child, signal.SIGTERM, 60, 124)
            else:
                try:
                    rc = child.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
    print(f"load: done in {time.monotonic() - t0:.0f} s, exit {rc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
