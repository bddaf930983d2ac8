"""The reference stack's storage side as real processes: Redis, the fault proxy and the LMCache
MP server (`lmcache server`), checked with LMCache's own `lmcache bench server --mode cpu`."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest

from chaos.stack.environment import service_environment
from chaos.stack.local import LocalStack
from chaos.stack.probe import listeners

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_lmcache_with_redis_and_fs_l2(tmp_path):
    stack = LocalStack(REPO / "compose/reference.yml", run_dir=tmp_path / "run", environ=dict(os.environ))
    ports = [int(v) for k, v in stack.env.items() if k.endswith("_PORT")]
    try:
        stack.up(["lmcache"])
        assert set(stack.pids()) == {"redis", "toxiproxy", "lmcache"}
        status = httpx.get(f"{stack.settings.lmcache_http}/status", timeout=5).json()
        assert status["is_healthy"] is True
        configured = [json.loads(a) for i, a in enumerate(stack.spec.services["lmcache"].argv())
                      if stack.spec.services["lmcache"].argv()[i - 1] == "--l2-adapter"]
        assert sorted(c["type"] for c in configured) == ["fs", "resp"]
        adapters = status["storage_manager"]["l2_adapters"]
        assert len(adapters) == len(configured)
        assert all(a["is_healthy"] for a in adapters)

        lmcache_port = stack.env["LMCACHE_PORT"]
        bench = subprocess.run(
            ["lmcache", "bench", "server", "--rpc-url", f"tcp://127.0.0.1:{lmcache_port}",
             "--url", stack.settings.lmcache_http, "--mode", "cpu", "--num-tokens", "512",
             "--start", "0", "--end", "3", "--kvcache-shape-spec", "(2,64,16,4,64):float32:4"],
            capture_output=True, text=True, timeout=240, env=service_environment())
        out = bench.stdout + bench.stderr
        assert bench.returncode == 0, out[-3000:]
        ok = re.search(r"Checksum OK:\s+(\d+)", out)
        failed = re.search(r"Checksum FAIL:\s+(\d+)", out)
        assert ok and failed, out[-3000:]
        assert int(ok.group(1)) > 0 and int(failed.group(1)) == 0, out[-3000:]

        # The resp L2 wrote to Redis through the proxy; the fs L2 wrote files.
        redis_port = stack.env["REDIS_PORT"]
        keys = subprocess.run(["redis-cli", "-p", redis_port, "dbsize"], capture_output=True, text=True)
        assert int(keys.stdout.strip()) > 0
        assert any(Path(stack.settings.l2_fs_path).iterdir())
        groups = {n: s.detail["pgid"] for n, s in stack.status().items() if s.pid}
        ours = stack.own_pids()
    finally:
        stack.down()
    for name, pgid in groups.items():
        left = [p.pid for p in psutil.process_iter() if _pgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE]
        assert left == [], f"{name} left processes {left}"
    # On a shared host another program may listen on one of these ports; none may be ours.
    held = [p for p in ports if any(o.pid in ours for o in listeners(p))]
    assert held == [], f"ports still held after down: {held}"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
