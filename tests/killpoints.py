"""Kill a real `kvchaos run` at a chosen moment and count what it left behind.

Shared by tests/runner/test_kill_points.py (a few points, in CI) and scripts/kill_points.py
(the acceptance size). Leftovers are found without trusting the journal:

- processes: every process whose environment has ``KVCHAOS_RUN_DIR`` under the run's report
  folder (LocalStack gives each service that variable) or that the journal names;
- mounts: every mount point under the report folder (the filesystem L2 tmpfs);
- ports: the ports the run's processes listened on when the signal was sent, and the stack's
  ``*_PORT`` values (from the journal and the stacks' state), still listening, by one of the
  run's processes or one that cannot be identified (a port another process took since is not
  the run's: the host is shared);
- journal entries: open entries in the run's private state folder;
- toxics: toxics on any proxy still answering at the stack's ``TOXIPROXY_PORT``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from chaos.journal import all_journals, open_entries
from kvchaos_support import default_sigint


@dataclass
class Point:
    """One kill: ``sig`` sent ``delay_s`` after the runner started, or after ``after`` was
    seen: a line of its output, ``"@process"`` (its journal holds a started process) or
    ``"@fault"`` (its journal holds an applied fault)."""

    sig: signal.Signals
    delay_s: float
    after: str | None = None


@dataclass
class Outcome:
    point: Point
    returncode: int | None
    sent_at_s: float | None
    stage: str | None = None
    report: bool = False
    verdict: str | None = None
    leftovers: dict[str, list] = field(default_factory=dict)
    cleanup_rc: int | None = None
    output: str = ""
    ports_taken: list[str] = field(default_factory=list)  # freed by the run, then bound by others

    def clean(self) -> bool:
        return not any(self.leftovers.values())


def ports_of(state: Path, reports: Path) -> set[int]:
    """The stack's port variables: from the journal's fault entries and the stacks' state."""
    ports: set[int] = set()
    for j in all_journals(state / "journal"):
        for line in j.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            for k, v in (e.get("stack_env") or {}).items():
                if k.endswith("_PORT") and str(v).isdigit():
                    ports.add(int(v))
    for st in reports.rglob("state.json"):
        try:
            env = json.loads(st.read_text()).get("env", {})
        except (OSError, ValueError):
            continue
        ports |= {int(v) for k, v in env.items() if k.endswith("_PORT") and str(v).isdigit()}
    return ports


def run_processes(reports: Path) -> list[psutil.Process]:
    """Processes of the run's services (``KVCHAOS_RUN_DIR`` under ``reports``)."""
    out, root = [], str(reports.resolve())
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("KVCHAOS_RUN_DIR", "").startswith(root):
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def ports_listened(reports: Path) -> set[int]:
    """TCP ports the run's service processes listen on right now."""
    ports: set[int] = set()
    for p in run_processes(reports):
        try:
            conns = p.net_connections(kind="inet") if hasattr(p, "net_connections") else p.connections(kind="inet")
        except (psutil.Error, OSError):
            continue
        ports |= {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
    return ports


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def listeners(port: int) -> list[int | None]:
    """Pids listening on ``port`` (None: a socket whose process could not be seen)."""
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return [None] if listening(port) else []
    return [c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


def held_ports(ports: set[int], reports: Path, pids: set[int] = frozenset()) -> tuple[list[int], list[str]]:
    """(ports still held by the run: a listener of the run's own or one not identified, ports
    another process took since: "port (pid name)"). On a shared host a port the run freed may be
    picked at once by someone else's stack; that is not the run's leftover. ``pids``: the run's
    processes the journal names (redis-server rewrites its environment block for its process
    title, so the environment alone does not find it)."""
    ours = {p.pid for p in run_processes(reports)} | set(pids)
    held, taken = [], []
    for port in sorted(ports):
        pids = listeners(port)
        if not pids:
            continue
        if any(pid is None or pid in ours for pid in pids):
            held.append(port)
        else:
            names = []
            for pid in pids:
                try:
                    names.append(f"{pid} {psutil.Process(pid).name()}")
                except psutil.Error:
                    names.append(str(pid))
            taken.append(f"{port} ({', '.join(names)})")
    return held, taken


def processes_under(reports: Path, journal_pids: set[int]) -> list[str]:
    out = []
    root = str(reports.resolve())
    for p in psutil.process_iter(["pid", "name", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            env = p.environ()
            if env.get("KVCHAOS_RUN_DIR", "").startswith(root) or p.pid in journal_pids:
                out.append(f"{p.pid} {p.info['name']}")
        except (psutil.Error, OSError):
            continue
    return out


def leftovers(state: Path, reports: Path, ports: set[int], proxy_port: int | None) -> dict[str, list]:
    """What a run under ``reports`` with state in ``state`` left: processes, mounts, ports,
    journal entries, toxics (each a list, empty when nothing)."""
    entries = [e for j in all_journals(state / "journal") for e in open_entries(j)]
    pids = {int(e["pid"]) for e in entries if e.get("kind") in ("process", "paused") and "pid" in e}
    root = str(reports.resolve())
    mounts = [p.mountpoint for p in psutil.disk_partitions(all=True) if p.mountpoint.startswith(root)]
    toxics: list = []
    if proxy_port:
        try:
            proxies = httpx.get(f"http://127.0.0.1:{proxy_port}/proxies", timeout=1).json()
            toxics = [f"{n}:{t['name']}" for n, p in proxies.items() for t in p.get("toxics", [])]
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
    held, _taken = held_ports(ports, reports, pids)
    return {"processes": processes_under(reports, pids), "mounts": mounts, "ports": held,
            "journal": [f"{e['kind']} {e.get('key')}" for e in entries], "toxics": toxics}


def kill_point(scenario: Path, point: Point, workdir: Path, *, env: dict[str, str] | None = None,
               timeout_s: float = 600.0, proxy_port_var: str = "TOXIPROXY_PORT",
               cleanup_after_kill: bool = True, command: list[str] | None = None) -> Outcome:
    """Start ``kvchaos run scenario`` (or ``command``, which gets ``{reports}`` filled in) with a
    private state folder under ``workdir``, send the point's signal, wait for the runner; after
    SIGKILL run ``kvchaos cleanup`` (the same state folder; unless ``cleanup_after_kill`` is
    False); then count leftovers."""
    state, reports = workdir / "state", workdir / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    e = dict(env or os.environ, KVCHAOS_STATE_DIR=str(state))
    log = open(workdir / "runner.log", "w+")
    t0 = time.monotonic()
    argv = [a.replace("{reports}", str(reports)) for a in command] if command else \
        [sys.executable, "-m", "chaos.cli", "run", str(scenario), "--report-dir", str(reports)]
    # As from a terminal: SIGINT at its default even when this harness runs in the background
    # (a non-interactive shell starts `&` jobs with SIGINT ignored, and children inherit that).
    runner = subprocess.Popen(argv, env=e, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
                              preexec_fn=default_sigint)
    sent = None
    try:
        if point.after:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and runner.poll() is None:
                if point.after in ("@process", "@fault"):
                    if any(x.get("kind") == point.after[1:] for j in all_journals(state / "journal")
                           for x in open_entries(j)):
                        break
                elif point.after in (workdir / "runner.log").read_text(errors="replace"):
                    break
                time.sleep(0.05)
            t0 = time.monotonic()
        while runner.poll() is None and time.monotonic() - t0 < point.delay_s:
            time.sleep(0.02)
        ports = ports_of(state, reports) | ports_listened(reports)
        if runner.poll() is None:
            runner.send_signal(point.sig)
            sent = time.monotonic() - t0
        runner.wait(timeout_s)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    log.seek(0)
    out = Outcome(point, runner.returncode, sent, output=log.read()[-4000:])
    log.close()
    ports |= ports_of(state, reports)
    proxy_port = None
    for st in reports.rglob("state.json"):
        try:
            proxy_port = int(json.loads(st.read_text())["env"].get(proxy_port_var) or 0) or None
        except (OSError, ValueError, KeyError):
            pass
    runs = [d for d in reports.rglob("*") if d.is_dir() and (d / "result.json").exists()
            and not d.name.startswith("suite-")]
    if runs:
        result = json.loads((runs[0] / "result.json").read_text())
        out.report, out.verdict = True, result["verdict"]
        out.stage = (result.get("interrupted") or {}).get("stage")
    if point.sig == signal.SIGKILL and cleanup_after_kill:
        r = subprocess.run([sys.executable, "-m", "chaos.cli", "cleanup"], env=e, capture_output=True, text=True,
                           timeout=300)
        out.cleanup_rc = r.returncode
        out.output += "\n--- cleanup ---\n" + r.stdout + r.stderr
    time.sleep(0.2)  # a process group ended a moment ago may still be reaped
    out.leftovers = leftovers(state, reports, ports, proxy_port)
    journal_pids = {int(x["pid"]) for j in all_journals(state / "journal") for x in open_entries(j)
                    if x.get("kind") in ("process", "paused") and "pid" in x}
    out.ports_taken = held_ports(ports, reports, journal_pids)[1]
    return out


def random_points(n_each: int, total_s: float, seed: int, startup_marker: str | None = None) -> list[Point]:
    """``n_each`` points per signal (SIGTERM, SIGINT, SIGKILL), at uniform random times in
    [0, total_s) after the runner starts preparing the stack (``startup_marker`` seen in its
    output), so stack start-up is included."""
    rng = random.Random(seed)
    return [Point(sig, round(rng.uniform(0, total_s), 2), startup_marker)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL) for _ in range(n_each)]
