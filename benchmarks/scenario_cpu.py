"""Where the CPU of scenario runs goes: CPU-seconds per process kind (engine, recompute twin,
LMCache, its witness, the proxy, Redis, the kvchaos process itself, other) and in all, for one
``kvchaos run`` of the given scenarios (serial, one stack reused as ``kvchaos run`` does).

On a 2-core CI machine that is busy (``make test`` runs three pytest-xdist workers beside two
other suites) the wall time of a stage is about its CPU-seconds / 2, so CPU-seconds, not wall
time, is what a change of the runner or the stack must cut.

    run:   kvchaos run --report-dir TMP SCENARIO...   (a child; its stack: grandchildren)
    every --sample-s: the child's process tree, each process's cpu_times (user + system) kept
           by pid (the last reading before it exits; a process that lives less than one sample
           is counted by the total only)
    total: getrusage(RUSAGE_CHILDREN) after the child is waited for (every waited descendant)

Usage:
    .venv/bin/python benchmarks/scenario_cpu.py [--base-ref main] [--json OUT] SCENARIO...

With ``--base-ref REF`` the same scenarios run first on REF's code (a temporary git worktree,
put first on PYTHONPATH for kvchaos and every service it starts), then on this tree's, in the
same run (these machines are noisy: never compare figures of two runs). Prints one line per
process kind (CPU-seconds, share), the wall time, the load average before and after, the
verdicts, and the ratios new/base; ``--json`` writes the figures.

Measured 2026-12-07 04:32-04:50 UTC on the 2-core CI machine, load average 9.4-10 (other
sessions' suites), ``--base-ref main`` with smoke, lookup-timeout, node-exit-lmcache and
preemption: main 204.5 CPU-s / 566 s wall, the fastrun branch 162.1 CPU-s / 451 s (x0.79 CPU,
x0.80 wall), the same four verdicts (passed); the kvchaos process 24.6 -> 9.1 CPU-s, the witness
LMCache 23.1 -> 16.0, the twin 63.6 -> 54.8, the engine 58.2 -> 52.4.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]

#: (kind, substring of the command line), first match wins; the order matters (the twin's
#: command line also says "engine serve").
KINDS = (
    ("recompute-twin", "kv_producer"),
    ("engine", "engine serve"),
    ("lmcache", "chaos.stack.lmcache_locks"),
    ("lmcache-witness", "lmcache server"),
    ("proxy", "proxy serve"),
    ("proxy", "toxiproxy"),
    ("redis", "redis-server"),
    ("kvchaos", "kvchaos run"),
)


def kind_of(cmdline: list[str]) -> str:
    """The process kind of a command line (``KINDS``), else ``other``."""
    text = " ".join(cmdline)
    for kind, needle in KINDS:
        if needle in text:
            return kind
    return "other"


def _sample(root: psutil.Process, seen: dict[int, tuple[str, float]], stop: threading.Event, every_s: float) -> None:
    while not stop.is_set():
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    key = (p.pid, p.create_time())
                    kind = seen.get(key, (None,))[0] or kind_of(p.cmdline())
                seen[key] = (kind, t.user + t.system)
            except psutil.Error:
                continue
        stop.wait(every_s)


def measure(scenarios: list[str], *, sample_s: float = 0.5, extra: list[str] | None = None,
            code: Path | None = None) -> dict:
    """Run ``kvchaos run`` on ``scenarios`` and measure its CPU (see the module doc).

    Returns:
        ``{"wall_s", "cpu_s" (all waited descendants), "by_kind": {kind: cpu_s}, "verdicts":
        {scenario: verdict}, "load_before", "load_after", "exit"}``.
    """
    kvchaos = str(Path(sys.executable).with_name("kvchaos"))
    env = dict(os.environ)
    if code is not None:  # its chaos/ before the editable install's
        env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory(prefix="kvchaos-cpu-") as tmp:
        env["KVCHAOS_ORACLE_DIR"] = str(Path(tmp) / "oracle")  # every run asks its twin afresh
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_before = os.getloadavg()[0]
        t0 = time.monotonic()
        child = subprocess.Popen([kvchaos, "run", "--report-dir", str(Path(tmp) / "reports"), *(extra or []),
                                  *[str(Path(s).resolve()) for s in scenarios]], cwd=code or ROOT, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen: dict = {}
        stop = threading.Event()
        sampler = threading.Thread(target=_sample, args=(psutil.Process(child.pid), seen, stop, sample_s),
                                   daemon=True)
        sampler.start()
        _, err = child.communicate()
        wall = time.monotonic() - t0
        stop.set()
        sampler.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        verdicts = {}
        for result in (Path(tmp) / "reports").glob("*/result.json"):
            data = json.loads(result.read_text())
            verdicts[data["scenario"]] = data["verdict"]
    by_kind: dict[str, float] = {}
    for kind, cpu in seen.values():
        by_kind[kind] = by_kind.get(kind, 0.0) + cpu
    cpu_total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    by_kind["unsampled"] = max(0.0, cpu_total - sum(by_kind.values()))
    return {"wall_s": wall, "cpu_s": cpu_total, "by_kind": by_kind, "verdicts": verdicts,
            "load_before": load_before, "load_after": os.getloadavg()[0], "exit": child.returncode,
            "stderr_tail": err[-2000:]}


def _print(m: dict, base: dict | None) -> None:
    print(f"{m['label']}: wall {m['wall_s']:.1f}s  CPU {m['cpu_s']:.1f}s  exit {m['exit']}  "
          f"load {m['load_before']:.1f} -> {m['load_after']:.1f}"
          + (f"  (vs {base['label']}: wall x{m['wall_s'] / base['wall_s']:.2f}, "
             f"CPU x{m['cpu_s'] / base['cpu_s']:.2f})" if base else ""))
    for kind, cpu in sorted(m["by_kind"].items(), key=lambda kv: -kv[1]):
        ref = (base or {}).get("by_kind", {}).get(kind)
        print(f"  {kind:16s} {cpu:7.1f}s  {100 * cpu / max(m['cpu_s'], 1e-9):5.1f}%"
              + (f"   {base['label']} {ref:7.1f}s" if ref is not None else ""))
    for name, verdict in sorted(m["verdicts"].items()):
        ref = (base or {}).get("verdicts", {}).get(name)
        print(f"  {name:40s} {verdict}" + (f"   (DIFFERS: {base['label']} {ref})" if base and ref != verdict else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="+")
    ap.add_argument("--base-ref", help="git ref to measure first, in the same run (e.g. main)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--sample-s", type=float, default=0.5)
    args = ap.parse_args()
    runs = []
    if args.base_ref:
        with tempfile.TemporaryDirectory(prefix="kvchaos-base-") as tmp:
            tree = Path(tmp) / "tree"
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), args.base_ref], cwd=ROOT, check=True)
            try:
                runs.append(dict(measure(args.scenarios, sample_s=args.sample_s, code=tree), label=args.base_ref))
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
        _print(runs[0], None)
    runs.append(dict(measure(args.scenarios, sample_s=args.sample_s, code=ROOT), label="this tree"))
    _print(runs[-1], runs[0] if args.base_ref else None)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
