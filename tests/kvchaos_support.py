"""Helpers shared by the test modules (on ``sys.path`` through ``pythonpath`` in pyproject.toml).

- ``fault(kind, **fields)``: a fault built from fields exactly as a YAML scenario's fault is
  (validated through the scenario model), so tests exercise the same defaults and errors.
- ``local_stack(tmp_path, text, **env)``: a LocalStack (not started) for a stack file's text.
- ``LMCACHE_FS_STACK``: a real ``lmcache server`` with one filesystem L2 adapter.
- ``lmcache_bench(stack, tokens)``: one request through LMCache's own CPU client (lookup,
  store, retrieve) against a running stack's LMCache.
- skip markers for what a test needs on this machine.
- ``ServerThread``, ``Upstream``, ``echo``: a fault proxy in a background event loop and real TCP
  upstreams (threads), for tests that drive traffic through the proxy.
- ``http_server(handler)``: a small real HTTP server in a thread (a stand-in for an engine or
  LMCache HTTP API with just the routes a test needs).
- ``flaky_stack(crashing)``: a stack file's text with one service, ``flaky``, whose start-ups
  numbered in ``crashing`` exit 3 at once (a crash at start-up, no port held by another).
- ``mounts_under(root)``, ``open_journal_entries(state_dir)``: what a run left mounted under its
  folder, and what its journals still hold open (the "leaves nothing" assertions).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from chaos.faults.base import Fault
from chaos.faults.registry import build_fault
from chaos.journal import Journal, open_entries
from chaos.proxy.server import ProxyServer
from chaos.scenario.model import Scenario
from chaos.stack.local import LocalStack
from chaos.stack.mounts import mounts_under  # noqa: F401  (re-exported for the tests)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting the L2 tmpfs needs root")
needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server on PATH")
needs_lmcache = pytest.mark.skipif(not Path(sys.executable).with_name("lmcache").exists(),
                                   reason="needs LMCache installed in this environment")

#: A real LMCache MP server whose only L2 is the filesystem adapter under the run folder.
LMCACHE_FS_STACK = """
services:
  lmcache:
    command: [lmcache, server, --host, 127.0.0.1, --port, "${LMCACHE_PORT:-0}",
              --http-host, 127.0.0.1, --http-port, "${LMCACHE_HTTP_PORT:-0}",
              --prometheus-port, "${LMCACHE_PROMETHEUS_PORT:-0}",
              --chunk-size, "256", --l1-size-gb, "0.2", --eviction-policy, LRU,
              --supported-transfer-mode, auto,
              --l2-adapter, '{"type": "fs", "base_path": "${KVCHAOS_RUN_DIR}/l2fs"}']
    healthcheck:
      test: [CMD, kvchaos, probe, "http://127.0.0.1:${LMCACHE_HTTP_PORT:-0}/healthcheck"]
      interval: 500ms
      retries: 120
    stop_grace_period: 5s
x-kvchaos:
  lmcache: lmcache
  lmcache_http: http://127.0.0.1:${LMCACHE_HTTP_PORT:-0}
  l2_fs_path: ${KVCHAOS_RUN_DIR}/l2fs
"""


def true_within(probe: Callable[[], bool], seconds: float) -> bool:
    """Whether ``probe()`` comes true once within ``seconds``, asked again and again (at least
    once). For a claim about speed on a loaded host ("the toxic is gone: a fast round trip, a
    window over the cap"): one sample alone may be slow with nothing in the way, as CI's stage
    2 showed (3 xdist workers beside stacks, 2026-12-07), while a toxic still in place fails
    every sample."""
    deadline = time.monotonic() + seconds
    while True:
        if probe():
            return True
        if time.monotonic() > deadline:
            return False


def open_journal_entries(state_dir: str | Path) -> list[str]:
    """``"<kind> <key>"`` of each entry still open in the journals under ``state_dir`` (a run's
    ``KVCHAOS_STATE_DIR``): what ``kvchaos cleanup`` would still have to undo."""
    from chaos.journal import all_journals

    return [f"{e.get('kind')} {e.get('key')}" for j in all_journals(Path(state_dir) / "journal")
            for e in open_entries(j)]


def default_sigint() -> None:
    """``preexec_fn`` of a child a test sends SIGINT to: the signal's default disposition. A
    shell starts a background job (``cmd &``, nohup, cron-like runners) with SIGINT ignored,
    the child inherits that, and Python (and kvchaos, on purpose: chaos/interrupts.py) keeps an
    inherited SIG_IGN, so the test would see its SIGINT ignored because of how CI was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def command_line(proc: psutil.Process | int) -> str:
    """The command line of ``proc`` (a ``psutil.Process`` or a pid) joined by spaces, or ``""``
    when it cannot be read: the process has exited, is a zombie its parent has not reaped yet
    (psutil raises ``ZombieProcess`` for its ``cmdline()``), or is not ours to read. A test that
    scans a starting stack's process tree meets such short-lived children (a set-up subprocess
    that just ended): the input that showed it, a ``ZombieProcess`` raised from
    tests/vllm/test_benchmark_signals.py's wait for the services in CI."""
    try:
        p = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def communicate_or_dump(proc: subprocess.Popen, timeout: float, state_dir: str | Path | None = None) -> str:
    """``proc.communicate(timeout)``'s stdout; when it does not end in time, fail the test with
    every thread's stack of the child (``kvchaos`` prints them on SIGUSR1: chaos/cli.py
    dump_stacks_on_sigusr1) and its last output, then kill it: a hung run says where it hung.

    With ``state_dir`` (the child's ``KVCHAOS_STATE_DIR``), ``kvchaos cleanup`` then undoes what
    the killed child left (its processes, faults, tmpfs mounts, containers: its journal knows
    them), so a hung run does not leave a mounted disk or a stack behind on a CI host; what the
    cleanup said goes into the failure message."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(3)
        proc.kill()
        proc.wait(60)
        cleaned = ""
        if state_dir is not None:  # first: a process it left may hold its output pipe open
            r = subprocess.run([sys.executable, "-m", "chaos.cli", "cleanup"], capture_output=True, text=True,
                               timeout=300, env=dict(os.environ, KVCHAOS_STATE_DIR=str(state_dir)))
            cleaned = f"\nkvchaos cleanup (exit {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}"
        try:
            out = proc.communicate(timeout=60)[0] or ""
        except subprocess.TimeoutExpired:
            out = "(its output pipe stayed open: a process it started still holds it)"
        pytest.fail(f"pid {proc.pid} did not end within {timeout:.0f}s; its stacks and last output:\n"
                    + out[-12000:] + cleaned, pytrace=False)


def lmcache_bench(stack, tokens: int = 512) -> str:
    """One ``tokens``-token request of ``lmcache bench server --mode cpu`` against the stack's
    LMCache (lookup, store of the chunks to L1 and the L2 tiers, retrieve); returns its output.

    Raises:
        AssertionError: the client exited non-zero.
    """
    import subprocess

    from chaos.stack.environment import service_environment

    lmcache = str(Path(sys.executable).with_name("lmcache"))
    r = subprocess.run([lmcache, "bench", "server", "--rpc-url", f"tcp://127.0.0.1:{stack.env['LMCACHE_PORT']}",
                        "--url", stack.settings.lmcache_http, "--mode", "cpu", "--num-tokens", str(tokens),
                        "--start", "0", "--end", "1", "--kvcache-shape-spec", "(2,64,16,4,64):float32:4", "-q"],
                       capture_output=True, text=True, timeout=180, env=service_environment())
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    return r.stdout + r.stderr


def fault(kind: str, **fields) -> Fault:
    """The fault a scenario's ``faults:`` item ``{kind: ..., duration: 5, **fields}`` builds.

    Raises:
        pydantic.ValidationError: the fields are not valid for ``kind``.
    """
    item = {"kind": kind, "duration": 5, **fields}
    s = Scenario.model_validate(
        {"name": "t", "stack": "s.yml", "phases": [{"name": "p", "faults": [item]}],
         "checks": {"evidence": {}}},
        context={"check_paths": False},
    )
    return build_fault(s.phases[0].faults[0])


def local_stack(tmp_path: Path, text: str, journal: Journal | None = None, **env: str) -> LocalStack:
    """A LocalStack (not started) for the stack file ``text``, written to ``tmp_path/stack.yml``,
    run in ``tmp_path/run``, with this process's environment plus ``env``."""
    f = tmp_path / "stack.yml"
    f.write_text(text)
    return LocalStack(f, run_dir=tmp_path / "run", environ={**os.environ, **env}, journal=journal)


@contextmanager
def started(stack: LocalStack) -> Iterator[LocalStack]:
    """``stack`` up for the block; afterwards down, with nothing left open in its journal and no
    process group of it alive (AssertionError otherwise)."""
    stack.up()
    try:
        yield stack
    finally:
        stack.down()
        assert open_entries(stack.journal.path) == []
        assert not any(p.group_alive() for p in stack._procs.values())


@contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """A ThreadingHTTPServer on 127.0.0.1 with ``handler``, served from a daemon thread for the
    block; yields its port."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


class ServerThread:
    """Runs a ProxyServer on its own event loop in a daemon thread."""

    def __init__(self, seed: int | None = 1, loop: str = "asyncio") -> None:
        if loop == "uvloop":
            uvloop = pytest.importorskip("uvloop")
            self.loop = uvloop.new_event_loop()
        else:
            self.loop = asyncio.new_event_loop()
        self.server = ProxyServer("127.0.0.1", 0, seed=seed)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start())

    def call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def _real_toxiproxy_missing() -> str | None:
    from chaos.proxy.real import MissingToxiproxy, find_binary

    try:
        find_binary()
    except MissingToxiproxy as exc:
        return str(exc)
    return None


#: Tests that run the real Toxiproxy (KVCHAOS_TOXIPROXY_BIN or toxiproxy-server on PATH; the
#: Makefile points the variable at ../shared/tools/toxiproxy when it is there).
needs_real_toxiproxy = pytest.mark.skipif(_real_toxiproxy_missing() is not None,
                                          reason=f"needs the real Toxiproxy: {_real_toxiproxy_missing()}")


class RealToxiproxy:
    """The real ``toxiproxy-server`` (``-proxy-metrics``) on a free loopback port, as a child
    process; same ``url``/``close()`` as :class:`ServerThread`."""

    def __init__(self, seed: int | None = 1) -> None:
        import subprocess
        import time

        import httpx

        from chaos.proxy.real import real_argv
        from chaos.stack.spec import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(real_argv("127.0.0.1", self.port, seed=seed),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(self.url + "/version", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"toxiproxy-server did not start on {self.url}")
            time.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except Exception:
                self.proc.kill()
                self.proc.wait(5)


def proxy_server(kind: str):
    """A running proxy server of ``kind``: ``asyncio``/``uvloop`` (the bundled proxy on that
    event loop, in this process) or ``real`` (the real Toxiproxy; skipped when absent)."""
    if kind == "real":
        missing = _real_toxiproxy_missing()
        if missing:
            pytest.skip(f"needs the real Toxiproxy: {missing}")
        return RealToxiproxy()
    return ServerThread(loop=kind)


class Upstream:
    """A threaded TCP server on 127.0.0.1 running ``handler(conn)`` per connection."""

    def __init__(self, handler: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.handler = handler
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            self.handler(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


def echo(conn: socket.socket) -> None:
    """Echo every byte back until EOF."""
    while True:
        data = conn.recv(65536)
        if not data:
            return
        conn.sendall(data)


def run_pooled(pool, tmp_path: Path, text: str, stack_file: Path, run_id: str, timeout_s: float = 400):
    """Run the scenario ``text`` (``STACK`` in it replaced by ``stack_file``) on a stack of
    ``pool`` (chaos.runner.stacks.StackPool, reset between scenarios as a suite does).

    Returns:
        ``(RunResult, {check name: CheckResult})``; AssertionError when the run had an error.
    """
    from chaos.runner.run import run_scenario
    from chaos.runner.suite import load_and_validate

    path = tmp_path / "s.yaml"
    path.write_text(text.replace("STACK", str(stack_file)))
    (scenario,) = load_and_validate([path])
    stack = pool.acquire(stack_file, scenario.stack_variables())
    result = run_scenario(scenario, stack, tmp_path / "run", run_id=run_id, timeout_s=timeout_s)
    pool.release(stack_file, result)
    assert result.error is None, result.error
    return result, {c.name: c for c in result.checks}


def scenario_text(name: str, phases: str, *, workload: str, checks: str, bugs: str = "[]",
                  variables: str = "{}") -> str:
    """A scenario file on ``STACK`` (see :func:`run_pooled`) with these phases, workload and
    checks (YAML text, ``phases`` and ``checks`` indented as items of their keys)."""
    return (f"name: {name}\ndescription: test\nstack: STACK\nseed: 5\nengine: {{bugs: {bugs}}}\n"
            f"variables: {variables}\nworkload: {workload}\nphases:\n{phases}checks:\n{checks}")


def flaky_stack(crashing: str = "2") -> str:
    """A stack file's text: one HTTP service, ``flaky``, whose start-ups numbered in ``crashing``
    (comma-separated, counted in the stack folder's ``flaky-starts``) exit with code 3 at once, as
    LMCache 0.5.6 did at start-up when its RESP workers' double close(2) hit its event loop's
    epoll set (docs/findings/resp-adapter-workers-exit.md); the others serve on ``FLAKY_PORT``.
    Default: the second start-up, i.e. a kill fault's restart, crashes."""
    script = ("import os, sys; p = 'flaky-starts'; n = int(open(p).read()) + 1 if os.path.exists(p) else 1; "
              "open(p, 'w').write(str(n)); sys.exit(3) if str(n) in sys.argv[2].split(',') else "
              "os.execvp(sys.executable, [sys.executable, '-m', 'http.server', sys.argv[1], '--bind', '127.0.0.1'])")
    return f"""
services:
  flaky:
    command: [python, -c, "{script}", "${{FLAKY_PORT:-0}}", "{crashing}"]
    healthcheck: {{test: [CMD, kvchaos, probe, "http://127.0.0.1:${{FLAKY_PORT:-0}}/"], interval: 100ms, retries: 100}}
"""
