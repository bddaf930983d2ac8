"""Real processes for the engine tests: redis-server, `lmcache server`, reference engines.

Each runs in its own process group on free 127.0.0.1 ports and is killed at teardown. No
stubs: LMCache is the real MP server with a Redis (resp) and a filesystem L2.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from chaos.engine.environment import apply_lmcache_environment

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

# Small model for tests: fast on 2 cores, still context-sensitive (see model.py init_std).
SMALL_MODEL = ["--num-layers", "2", "--hidden-size", "128", "--num-heads", "4",
               "--num-kv-heads", "2", "--intermediate-size", "256"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """Environment for child processes (no telemetry; repo on PYTHONPATH)."""
    env = apply_lmcache_environment(dict(os.environ))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


class Proc:
    """A child process in its own process group, with its log file."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.env = dict(env or {})
        self.log_path = log_dir / f"{name}.log"
        self.popen: subprocess.Popen | None = None

    def start(self) -> None:
        """Spawn the process (appending to its log), with :func:`child_env` and ``env`` over it."""
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                      env={**child_env(), **self.env}, start_new_session=True, cwd=REPO)
        log.close()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process group."""
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL the group and reap it."""
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s."""
        if self.popen is None or self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(timeout=5)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            self.kill()

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen is not None and self.popen.poll() is None

    def tail(self, n: int = 40) -> str:
        """Last ``n`` lines of the log (for failure messages)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


#: Seconds a test's LMCache server has to answer /status, and a test's engine /health.
LMCACHE_READY_S = 60.0
ENGINE_READY_S = 90.0


def wait_http(url: str, timeout_s: float, proc: Proc | None = None) -> None:
    """Wait for ``url`` to answer 2xx.

    Raises:
        RuntimeError: timeout, or ``proc`` died (its log tail in the message).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
        try:
            if httpx.get(url, timeout=2).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s}s" +
                       (f"\n{proc.tail()}" if proc else ""))


class LMCacheStack:
    """redis-server + `lmcache server` (resp and fs L2) on free ports."""

    def __init__(self, workdir: Path, l1_size_gb: float = 0.5) -> None:
        self.workdir = workdir
        self.redis_port = free_port()
        self.port = free_port()
        self.http_port = free_port()
        self.prom_port = free_port()
        self.fs_dir = workdir / "l2fs"
        self.fs_dir.mkdir(parents=True, exist_ok=True)
        redis = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.redis = Proc("redis", [redis, "--port", str(self.redis_port), "--bind",
                                    "127.0.0.1", "--save", "", "--appendonly", "no"], workdir)
        self.server = Proc("lmcache", [
            str(VENV_BIN / "lmcache"), "server", "--host", "127.0.0.1", "--port",
            str(self.port), "--http-port", str(self.http_port), "--prometheus-port",
            str(self.prom_port), "--l1-size-gb", str(l1_size_gb), "--eviction-policy", "LRU",
            "--chunk-size", "256", "--supported-transfer-mode", "auto",
            "--l2-adapter", json.dumps({"type": "resp", "host": "127.0.0.1",
                                        "port": self.redis_port, "num_workers": 2}),
            "--l2-adapter", json.dumps({"type": "fs", "base_path": str(self.fs_dir)}),
        ], workdir)

    @property
    def url(self) -> str:
        """ZMQ URL for the engine's ``--lmcache-url``."""
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start Redis and LMCache; wait until LMCache's /status answers. A start that fails
        (LMCache not ready in :data:`LMCACHE_READY_S`) stops both before it raises: a fixture
        that raises before its ``yield`` never runs its teardown, and a timed-out start on a
        loaded host left a redis-server and an LMCache server running with parent 1."""
        try:
            self.redis.start()
            self.start_server()
        except BaseException:
            self.stop()
            raise

    def start_server(self) -> None:
        """(Re)start only the LMCache server on the same ports."""
        self.server.start()
        wait_http(f"http://127.0.0.1:{self.http_port}/status", LMCACHE_READY_S, self.server)

    def status(self) -> dict[str, Any]:
        """LMCache ``GET /status``."""
        return httpx.get(f"http://127.0.0.1:{self.http_port}/status", timeout=10).json()

    def l1(self) -> dict[str, Any]:
        """The default L1 manager's counters from /status."""
        sm = self.status()["storage_manager"]
        managers = sm.get("l1_managers") or {"_default": sm.get("l1_manager", {})}
        return next(iter(managers.values()))

    def redis_keys(self) -> int:
        """Number of keys in Redis (DBSIZE over RESP, no client library needed)."""
        with socket.create_connection(("127.0.0.1", self.redis_port), timeout=5) as s:
            s.sendall(b"*1\r\n$6\r\nDBSIZE\r\n")
            reply = s.recv(64)
        return int(reply.strip().lstrip(b":"))

    def stop(self) -> None:
        """Kill both."""
        self.server.stop()
        self.redis.stop()


class Engine:
    """A reference engine process (``python -m chaos.engine serve``) and its HTTP client;
    ``env``: variables set for the process over :func:`child_env`."""

    def __init__(self, name: str, workdir: Path, args: list[str], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.args = args
        self.proc = Proc(name, [sys.executable, "-m", "chaos.engine", "serve", "--port",
                                str(self.port), *args], workdir, env)
        self.base = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.base, timeout=120)

    def start(self, wait_lmcache: bool = True) -> "Engine":
        """Start and wait for /health (and for the LMCache connector when configured); a start
        that fails stops the process before it raises (see :meth:`LMCacheStack.start`)."""
        try:
            self.proc.start()
            wait_http(self.base + "/health", ENGINE_READY_S, self.proc)
            if wait_lmcache and "lmcache-mp" in self.args:
                self.wait_lmcache("healthy", 60)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_lmcache(self, state: str = "healthy", timeout_s: float = 30) -> None:
        """Wait until ``/debug/state``'s ``lmcache.state`` is ``state``.

        ``state`` is ``healthy`` | ``unhealthy`` | ``connecting``. The connection's health
        follows LMCache's adapter heartbeat (one PING every ``--lmcache-heartbeat-interval``
        seconds, lmcache ``HeartbeatThread``), so a server resumed after SIGSTOP is seen as
        healthy again only after a PING and the re-registration of the KV caches. The
        scheduler adapter's heartbeat starts with its first lookup: before any request,
        ``healthy`` says nothing about the server.

        Raises:
            AssertionError: not reached within ``timeout_s`` seconds (the engine log's tail
                is in the message).
        """
        deadline = time.monotonic() + timeout_s
        while (now := self.state()["lmcache"]["state"]) != state:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.proc.name}: LMCache connection {now!r}, not "
                                     f"{state!r}, after {timeout_s} s\n{self.proc.tail()}")
            time.sleep(0.1)

    def complete(self, prompt: list[int] | str, max_tokens: int = 8, **extra: Any) -> dict:
        """POST /v1/completions; returns the JSON body (raises on HTTP errors)."""
        r = self.client.post("/v1/completions",
                             json={"prompt": prompt, "max_tokens": max_tokens, **extra})
        if r.status_code != 200:
            raise AssertionError(f"HTTP {r.status_code}: {r.text}")
        return r.json()

    def state(self) -> dict:
        """GET /debug/state."""
        return self.client.get("/debug/state").json()

    def metric(self, name: str) -> float:
        """Sum of the samples of metric ``name`` in /metrics."""
        total = 0.0
        for line in self.client.get("/metrics").text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        """Stop the process."""
        self.client.close()
        self.proc.stop()


def lmcache_args(stack: LMCacheStack, mq_timeout: float = 3.0, heartbeat: float = 1.0
                 ) -> list[str]:
    """Engine flags for the LMCache connector to ``stack``."""
    return ["--kv-connector", "lmcache-mp", "--lmcache-url", stack.url,
            "--lmcache-mq-timeout", str(mq_timeout), "--lmcache-heartbeat-interval",
            str(heartbeat)]


def random_prompt(seed: int | str, n: int) -> list[int]:
    """``n`` pseudo-random byte token ids, a pure function of ``seed``.

    Tests use seeds named after their module, so that no two tests share a prefix (and
    so an LMCache entry) by accident.
    """
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def ids(resp: dict) -> list[int]:
    """Token ids of the first choice."""
    return resp["choices"][0]["token_ids"]


def stats(resp: dict) -> dict:
    """``kv_transfer_params.cached_token_stats`` of a response."""
    return resp["kv_transfer_params"]["cached_token_stats"]
