"""Host-safe ports and identity: claims that hold across processes, state dirs and owners; a
health probe that accepts only the process the stack started; a lost bind is exit 3 naming the
service, the port and the other process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from chaos.stack import ports
from chaos.stack.base import StackError
from chaos.stack.spec import free_port, load_stack
from kvchaos_support import local_stack

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "compose" / "reference.yml"


CHILD = """
import json, os, sys, time
from pathlib import Path
go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.001)
from chaos.stack.spec import load_stack
spec = load_stack(sys.argv[2], run_dir=Path(sys.argv[3]))
print(json.dumps(sorted(int(v) for k, v in spec.env.items() if k.endswith("_PORT"))), flush=True)
time.sleep(3)  # keep the claims while the others resolve
"""


def test_concurrent_stacks_of_any_state_dir_get_disjoint_ports(tmp_path):
    """Six processes load the reference stack at the same moment, each with its own state dir
    (as other users' runs would): no port is given to two of them."""
    import json

    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(go), str(REFERENCE), str(tmp_path / f"run-{i}")],
                              env=dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / f"state-{i}")),
                              stdout=subprocess.PIPE, text=True)
             for i in range(6)]
    time.sleep(2)  # let every child import and wait at the line
    go.touch()
    got = [json.loads(p.stdout.readline()) for p in procs]
    for p in procs:
        p.wait(30)
    every = [port for g in got for port in g]
    assert len(every) == len(set(every)), got
    assert all(len(g) == len(got[0]) > 5 for g in got)


def test_a_claim_is_refused_to_another_owner_and_ends_with_its_process(tmp_path):
    port = free_port()
    assert ports.claim(port, "stack:a")
    assert ports.claim(port, "stack:a")  # the same owner again
    assert not ports.claim(port, "stack:b")  # another stack of this process
    code = f"from chaos.stack import ports; import sys; sys.exit(0 if ports.claim({port}, 'x') else 1)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 1  # another process
    assert "owner=stack:a" in (ports.holder(port) or "")
    ports.release([port], "stack:a")
    assert ports.holder(port) is None
    held = subprocess.Popen([sys.executable, "-c", f"from chaos.stack import ports; import time; "
                             f"assert ports.claim({port}); print('ok', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert held.stdout.readline().strip() == "ok"
        assert not ports.claim(port, "stack:a")
        assert "pid=" in ports.holder(port)
    finally:
        held.kill()
        held.wait()
    assert ports.claim(port, "stack:a")  # the lock ended with the process: no stale claim
    ports.release([port], "stack:a")


def test_picked_ports_lie_below_the_ephemeral_range():
    low, _ = ports.ephemeral_range()
    picked = [ports.pick_port("stack:pick") for _ in range(20)]
    try:
        assert len(set(picked)) == 20
        if low > 21000:
            assert all(20000 <= p < low for p in picked), picked
    finally:
        ports.release(picked, "stack:pick")


# An HTTP server that answers 200 on every path: a stand-in for another stack's engine.
IMPOSTOR = ("import http.server, sys\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
            "    def log_message(self, *a): pass\n"
            "s = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H)\n"
            "print('listening', flush=True)\n"
            "s.serve_forever()\n")


@pytest.fixture
def impostor():
    """Another program listening on a port (and answering every health check with 200)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", IMPOSTOR, str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "listening"
    yield port, proc.pid
    proc.kill()
    proc.wait()


def web_stack(command: str) -> str:
    """A one-service stack file: ``command`` serving HTTP on ${WEB_PORT}, probed there."""
    return textwrap.dedent(f"""
        services:
          web:
            command: {command}
            healthcheck:
              test: [CMD, kvchaos, probe, "http://127.0.0.1:${{WEB_PORT}}/"]
              interval: 100ms
              retries: 100
    """)


# Binds only after 30 s, as a model-loading engine does: the probe meets the impostor first.
SLOW_WEB = web_stack('[python, -c, "import time, http.server; time.sleep(30); http.server.test('
                     'HandlerClass=http.server.SimpleHTTPRequestHandler, port=${WEB_PORT}, bind=\'127.0.0.1\')"]')
FAST_WEB = web_stack('[python, -m, http.server, "${WEB_PORT}", --bind, 127.0.0.1]')


def test_a_probe_never_accepts_a_process_the_stack_did_not_start(tmp_path, impostor):
    port, pid = impostor
    stack = local_stack(tmp_path, SLOW_WEB, WEB_PORT=str(port))
    with pytest.raises(StackError) as err:
        stack.up()
    msg = str(err.value)
    assert "service 'web'" in msg and f"pid {pid}" in msg and f"port {port} (WEB_PORT)" in msg, msg
    assert "was answered by" in msg, msg  # refused at the first probe, not after the deadline
    assert not any(p.group_alive() for p in stack._procs.values())


def test_a_lost_bind_names_the_service_the_port_and_the_other_process(tmp_path, impostor):
    port, pid = impostor
    f = tmp_path / "stack.yml"
    f.write_text(FAST_WEB)
    env = dict(os.environ, WEB_PORT=str(port), KVCHAOS_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "stack", "up", str(f)], env=env,
                       capture_output=True, text=True, timeout=120)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 3, out
    assert "'web'" in out and str(port) in out and f"pid {pid}" in out, out
    assert httpx.get(f"http://127.0.0.1:{port}/", timeout=5).text == "ok"  # the impostor is untouched


SERVE_ARGV1 = ("import http.server, sys; http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, "
               "port=int(sys.argv[1]), bind='127.0.0.1')")


def test_a_foreign_listener_on_another_port_the_service_names_is_exit_3(tmp_path, impostor):
    """The service is healthy on its own port, but another port its command names (as LMCache's
    RPC port beside its HTTP port) is another process's: the stack must not come up."""
    port, pid = impostor
    text = textwrap.dedent(f"""
        services:
          web:
            command: [python, -c, "{SERVE_ARGV1}", "${{WEB_PORT:-0}}", "${{RPC_PORT}}"]
            healthcheck:
              test: [CMD, kvchaos, probe, "http://127.0.0.1:${{WEB_PORT:-0}}/"]
              interval: 100ms
              retries: 100
    """)
    stack = local_stack(tmp_path, text, RPC_PORT=str(port))
    with pytest.raises(StackError) as err:
        stack.up()
    msg = str(err.value)
    assert f"port {port} (RPC_PORT) is held by pid {pid}" in msg and "'web'" in msg, msg
    assert not any(p.group_alive() for p in stack._procs.values())


def test_services_of_the_stack_may_hold_each_others_ports(tmp_path):
    """A port a service names but another service of the same stack listens on (the engine's
    LMCache address is the proxy's) is not foreign."""
    text = textwrap.dedent(f"""
        services:
          server:
            command: [python, -c, "{SERVE_ARGV1}", "${{SERVER_PORT:-0}}"]
            healthcheck:
              test: [CMD, kvchaos, probe, "http://127.0.0.1:${{SERVER_PORT:-0}}/"]
              interval: 100ms
              retries: 100
          client:
            command: [python, -c, "{SERVE_ARGV1}", "${{CLIENT_PORT:-0}}", "${{SERVER_PORT:-0}}"]
            depends_on: {{server: {{condition: service_healthy}}}}
            healthcheck:
              test: [CMD, kvchaos, probe, "http://127.0.0.1:${{CLIENT_PORT:-0}}/"]
              interval: 100ms
              retries: 100
    """)
    stack = local_stack(tmp_path, text)
    try:
        stack.up()
        assert {n: s.state for n, s in stack.status().items()} == {"server": "running", "client": "running"}
    finally:
        stack.down()
