"""benchmarks/vllm_stack.py stopped by SIGTERM while its vLLM stack starts: every service it
started is down and the stack's tmpfs is unmounted (it left them all up, the input that showed
it: a SIGTERM about 10 s into `benchmarks/vllm_stack.py`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kvchaos_support import command_line

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.vllm


def _alive(procs: list[psutil.Process]) -> list[str]:
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {command_line(p)[:120]}")
        except psutil.NoSuchProcess:
            pass
    return left


def test_a_sigterm_while_the_stack_starts_brings_every_service_down(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    log = tmp_path / "bench.log"
    # Output to a file, not a pipe: services that inherit a pipe die of SIGPIPE once its reader
    # is gone, which would hide services left up.
    with log.open("w") as out_file:
        bench = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "vllm_stack.py"), "--rounds", "1",
                                  "--scenarios", "smoke"], cwd=REPO, env=env, stdout=out_file,
                                 stderr=subprocess.STDOUT)
    parent = psutil.Process(bench.pid)
    try:
        # Wait until the LMCache server (its l2 fs path is under TMPDIR) and the vLLM twin run.
        deadline = time.monotonic() + 180
        services: list[psutil.Process] = []
        while time.monotonic() < deadline and bench.poll() is None:
            services = parent.children(recursive=True)
            lines = [command_line(p) for p in services]
            if any("lmcache" in c and "server" in c for c in lines) and any("chaos.vllm.launch" in c for c in lines):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the benchmark's services never all started (exit {bench.poll()})")
        time.sleep(3)
        services = parent.children(recursive=True)
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=240)
    finally:
        if bench.poll() is None:
            bench.kill()
    out = log.read_text()
    assert bench.returncode == 128 + signal.SIGTERM, out[-2000:]
    psutil.wait_procs(services, timeout=30)
    assert _alive(services) == [], out[-2000:]
    assert str(tmp_path) not in Path("/proc/mounts").read_text()
