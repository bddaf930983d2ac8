"""Host-safe ports and identity: claims that hold across processes, state dirs, owners, users
and umasks; a port is free only when nothing listens on it on any address; a port variable the
user set is claimed, and refused (exit 3, naming the holder) when another kvchaos stack holds it;
a health probe that accepts only the process the stack started; a lost bind, or a link port
another process holds, is exit 3 naming the service or link, the port and the other process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from chaos.stack import ports
from chaos.stack.base import StackError
from chaos.stack.spec import free_port, load_stack, port_is_free
from chaos.stack.local import LocalStack
from kvchaos_support import local_stack, started

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


def _default_ports(stack_file: Path) -> dict[str, int]:
    """``{VARIABLE: default}`` of every ``${NAME_PORT:-N}`` in a stack file."""
    import re

    found: dict[str, set[int]] = {}
    for name, port in re.findall(r"\$\{([A-Z0-9_]*PORT):-(\d+)\}", stack_file.read_text()):
        found.setdefault(name, set()).add(int(port))
    assert all(len(v) == 1 for v in found.values()), f"{stack_file.name}: one variable, two defaults: {found}"
    return {name: v.pop() for name, v in found.items()}


SHIPPED_STACKS = sorted((REPO / "compose").glob("*.yml"))


@pytest.mark.parametrize("stack_file", SHIPPED_STACKS, ids=lambda p: p.name)
def test_every_default_port_of_a_shipped_stack_lies_outside_the_ephemeral_range(stack_file):
    """The input that showed it: compose/vllm-cpu.yml's defaults were 35555-39090, inside this
    host's ephemeral range (32768-60999), and LMCache restarted by `kvchaos explore` found its
    HTTP port 38080 held as a connection's source port ("[Errno 98] ... address already in use",
    docs/explore.md run 4). The range is this host's, read from /proc."""
    low, high = ports.ephemeral_range()
    defaults = _default_ports(stack_file)
    assert defaults, f"{stack_file.name} has no default port"
    inside = {name: port for name, port in defaults.items() if low <= port <= high}
    assert inside == {}, f"{stack_file.name}: defaults in the ephemeral range {low}-{high}: {inside}"


def test_the_stacks_of_this_host_have_disjoint_default_ports():
    """The reference stack and the vLLM CPU stack run side by side here (`make test`'s last
    stage: the explore smoke beside the vLLM tier): no default of one is the other's."""
    reference = set(_default_ports(REFERENCE).values())
    vllm_cpu = set(_default_ports(REPO / "compose" / "vllm-cpu.yml").values())
    assert reference & vllm_cpu == set()


# An HTTP server that answers 200 on every path: a stand-in for another stack's engine.
IMPOSTOR = ("import http.server, sys\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
            "    def log_message(self, *a): pass\n"
            "s = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H)\n"
            "print('listening', flush=True)\n"
            "s.serve_forever()\n")


def child_on_a_port(code: str, ready: str):
    """A Python child running ``code`` with a free port as its argument, from the moment it
    printed ``ready`` until the generator ends: yields ``(port, pid)``."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", code, str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == ready
    yield port, proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def impostor():
    """Another program listening on a port (and answering every health check with 200)."""
    yield from child_on_a_port(IMPOSTOR, "listening")


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


def test_a_restart_that_finds_its_port_taken_as_a_source_port_is_a_lost_bind(tmp_path):
    """Input that showed it: `kvchaos explore --stack compose/vllm-cpu.yml --seed 4101` run 4
    (2026-12-07): LMCache SIGKILLed and started again 1 s later; both restarts logged "[Errno 98]
    error while attempting to bind on address ('127.0.0.1', 38080): address already in use" and
    exited (code 3), with nothing listening on 38080, and the stack took that for LMCache crashing
    at start-up (liveness failed: "service lmcache exited (returncode 3) ... and no fault killed
    it"). A connection whose source port is the service's port (vllm-cpu.yml's defaults lie in
    the kernel's ephemeral range) blocks the bind just as a listener does: a lost bind, not the
    service's exit."""
    text = textwrap.dedent("""
        services:
          web:
            command: [python, -m, http.server, "${WEB_PORT:-0}", --bind, 127.0.0.1]
            healthcheck:
              test: [CMD, kvchaos, probe, "tcp://127.0.0.1:${WEB_PORT:-0}"]
              interval: 100ms
              retries: 100
    """)
    with started(local_stack(tmp_path, text)) as stack:
        port = int(stack.env["WEB_PORT"])
        stack.kill("web", "SIGKILL")
        stack.stop("web")
        with socket.socket() as server, socket.socket() as client:
            server.bind(("127.0.0.1", 0))
            server.listen()
            deadline = time.monotonic() + 10
            while True:  # a probe's connection may linger a moment in the kernel
                try:
                    client.bind(("127.0.0.1", port))  # as a client's source port: no SO_REUSEADDR
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            client.connect(server.getsockname())
            with pytest.raises(StackError) as err:
                stack.start("web", wait=True)
        msg = str(err.value)
        assert err.value.exited is False, msg
        assert f"port {port} (WEB_PORT) is the source port of a connection of pid {os.getpid()}" in msg, msg
        assert "(a lost bind)" in msg, msg


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


def test_a_link_port_held_by_another_process_names_the_link_the_variable_the_port_and_the_holder(tmp_path, impostor):
    """The proxy's answer alone ("listen tcp 127.0.0.1:N: bind: address already in use") names
    neither the link nor who holds the port."""
    port, pid = impostor
    stack = LocalStack(REPO / "tests" / "runner" / "data" / "proxy-redis.yml", run_dir=tmp_path / "run",
                       environ={**os.environ, "REDIS_PROXY_PORT": str(port)})
    with pytest.raises(StackError) as err:
        stack.up()
    msg = str(err.value)
    assert "could not create the proxy links" in msg and err.value.service == "toxiproxy", msg
    assert f"link 'cache-link': port {port} (REDIS_PROXY_PORT) is held by pid {pid} (" in msg, msg
    assert "http.server" in msg.split(f"pid {pid} (", 1)[1], msg  # its command line
    assert not any(p.group_alive() for p in stack._procs.values())


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("address", ["127.0.0.2", "::1", "0.0.0.0"])
def test_a_default_port_held_on_another_address_is_replaced_and_the_stack_starts(tmp_path, address):
    """A listener on [::1]:PORT or 127.0.0.2:PORT is not seen by a bind on 127.0.0.1 alone: the
    default was kept, and the identity check (which sees listeners on every address) then ended
    the run with exit 3. A port is free only when nothing listens on it on any address."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    if family == socket.AF_INET6 and not _has_ipv6_loopback():
        pytest.skip("no IPv6 loopback")
    with socket.socket(family) as other:
        other.bind((address, 0))
        other.listen()
        port = other.getsockname()[1]
        assert not ports.is_free(port) and not port_is_free(port)
        stack = local_stack(tmp_path, web_stack(f'[python, -m, http.server, "${{WEB_PORT:-{port}}}", --bind, 127.0.0.1]')
                            .replace("${WEB_PORT}", f"${{WEB_PORT:-{port}}}"))
        assert stack.env["WEB_PORT"] != str(port)
        try:
            stack.up()
            assert stack.status()["web"].state == "running"
        finally:
            stack.down()


@pytest.fixture
def claims(monkeypatch):
    """A claims folder of this test (mode 1777 under /tmp, as the default one), for every
    process the test starts too."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="kvchaos-claims-", dir="/tmp"))
    os.chmod(d, 0o1777)
    monkeypatch.setenv("KVCHAOS_PORT_CLAIMS_DIR", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_claim_files_are_mode_0666_whatever_the_umask(claims):
    port = free_port()
    old = os.umask(0o077)
    try:
        assert ports.claim(port, "stack:umask")
        assert (claims / str(port)).stat().st_mode & 0o777 == 0o666
    finally:
        os.umask(old)
        ports.release([port], "stack:umask")


def test_a_claim_file_that_cannot_be_opened_counts_as_held(claims, monkeypatch, tmp_path):
    """Another user's claim file made under umask 077 (by a kvchaos before claim files were made
    0666) cannot be opened at all: the port is someone else's, a default on it is replaced, and
    nothing raises (it used to end the run with a PermissionError traceback and no report)."""
    port = free_port()
    unreadable = str(claims / str(port))
    real_open = os.open

    def deny(path, flags, *args, **kwargs):
        if str(path) == unreadable:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    assert not ports.claim(port, "stack:other-user")
    assert "not readable" in ports.holder(port)
    f = tmp_path / "stack.yml"
    f.write_text(f"services:\n  web:\n    command: [sleep, '${{WEB_PORT:-{port}}}']\n")
    spec = load_stack(f, run_dir=tmp_path / "run")
    assert spec.env["WEB_PORT"] != str(port)


OTHER_USER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("ports", sys.argv[1])
ports = sys.modules["ports"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ports)
print(json.dumps({"claimed": [ports.claim(int(p), "stack:nobody") for p in sys.argv[2:]],
                  "picked": ports.pick_port("stack:nobody")}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
                    reason="needs root (to run a process as the user nobody) and /usr/bin/python3")
def test_claim_files_of_a_umask_077_run_serve_another_user(claims, tmp_path):
    """Root claims under umask 077; then the user nobody claims: a free port whose file root made
    is claimed (the file is 0666), a port root holds is refused, an old unreadable 0600 file
    counts as held, and a port is picked, without a traceback. nobody runs a copy of
    chaos/stack/ports.py in a folder it can read: the checkout may not be (a fresh clone in a
    ``mktemp -d`` folder, mode 0700, failed here with a PermissionError on ports.py)."""
    import shutil
    import tempfile

    readable = Path(tempfile.mkdtemp(prefix="kvchaos-ports-", dir="/tmp"))
    os.chmod(readable, 0o755)
    module = readable / "ports.py"
    shutil.copyfile(REPO / "chaos" / "stack" / "ports.py", module)
    os.chmod(module, 0o644)
    free = free_port()
    held = free_port(avoid={free})
    old_style = free_port(avoid={free, held})
    mask = os.umask(0o077)
    try:
        assert ports.claim(free, "stack:root") and ports.claim(held, "stack:root")
        ports.release([free], "stack:root")
        (claims / str(old_style)).touch()
        os.chmod(claims / str(old_style), 0o600)
        r = subprocess.run(["/usr/bin/python3", "-c", OTHER_USER, str(module),
                            str(free), str(held), str(old_style)], capture_output=True, text=True, timeout=60,
                           user=65534, group=65534, env={"KVCHAOS_PORT_CLAIMS_DIR": str(claims), "PATH": "/usr/bin:/bin"},
                           cwd="/tmp")
    finally:
        os.umask(mask)
        ports.release([held], "stack:root")
        shutil.rmtree(readable, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    import json

    got = json.loads(r.stdout)
    assert got["claimed"] == [True, False, False], got
    assert got["picked"] not in (held, old_style)


HOLD_CLAIM = ("from chaos.stack import ports; import sys, time; assert ports.claim(int(sys.argv[1]), 'stack:/other/run'); "
              "print('held', flush=True); time.sleep(120)")


@pytest.fixture
def claimed_elsewhere():
    """A port another kvchaos process claims (owner ``stack:/other/run``): ``(port, pid)``."""
    yield from child_on_a_port(HOLD_CLAIM, "held")


def test_a_set_port_another_stack_claims_is_refused_naming_the_variable_the_port_and_the_holder(
        tmp_path, claimed_elsewhere):
    """Run B with REDIS_PORT set to a port run A claimed used to start anyway: B's redis took the
    port A's engine was about to bind (A exit 3, B passed)."""
    f = tmp_path / "stack.yml"
    f.write_text("services:\n  web:\n    command: [sleep, '${WEB_PORT:-0}', '${OTHER_PORT:-0}']\n")
    port, pid = claimed_elsewhere
    with pytest.raises(StackError) as err:  # another process's claim
        load_stack(f, run_dir=tmp_path / "b", environ={"WEB_PORT": str(port)})
    msg = str(err.value)
    assert f"WEB_PORT={port}" in msg and f"pid={pid}" in msg and "owner=stack:/other/run" in msg, msg
    # Another stack of this process: its owner is named too.
    a = load_stack(f, run_dir=tmp_path / "a", environ={})
    mine = int(a.env["WEB_PORT"])
    with pytest.raises(StackError, match=rf"WEB_PORT={mine}: .*pid={os.getpid()} owner=stack:{tmp_path / 'a'}"):
        load_stack(f, run_dir=tmp_path / "b", environ={"WEB_PORT": str(mine)})
    # What the refused stack claimed before the refusal is not kept.
    with pytest.raises(StackError):
        load_stack(f, run_dir=tmp_path / "b", environ={"OTHER_PORT": str(free_port()), "WEB_PORT": str(port)})
    assert ports.owned(f"stack:{tmp_path / 'b'}") == []
    # The same stack again (a restart, a reconfigure) and a re-attached one are never refused.
    again = load_stack(f, run_dir=tmp_path / "a", environ=a.env)
    assert again.env["WEB_PORT"] == str(mine)
    attached = load_stack(f, run_dir=tmp_path / "c", environ=a.env, refuse_claimed=False)
    assert attached.env["WEB_PORT"] == str(mine)
    ports.release_all(f"stack:{tmp_path / 'a'}")
    ports.release_all(f"stack:{tmp_path / 'c'}")


def test_a_run_with_a_set_port_another_run_claims_is_exit_3_with_its_report(tmp_path, claimed_elsewhere):
    port, pid = claimed_elsewhere
    env = dict(os.environ, REDIS_PORT=str(port), KVCHAOS_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "run", str(REPO / "tests" / "runner" / "data" / "hold-latency.yaml"),
                        "--report-dir", str(tmp_path / "r")], env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 3 and "Traceback" not in out, out[-3000:]
    import json

    (run,) = [d for d in (tmp_path / "r").iterdir() if d.name.startswith("hold-latency")]
    error = json.loads((run / "result.json").read_text())["error"]
    assert f"REDIS_PORT={port}" in error and f"pid={pid}" in error and "owner=stack:/other/run" in error, error
    assert (run / "report.html").exists()
    assert not (run / "history.jsonl").exists() or not (run / "history.jsonl").read_text()  # nothing started


def test_a_detached_stack_is_reached_whoever_claims_its_ports_since(tmp_path):
    """`kvchaos stack up` ends and its claims with it; `stack status` and `stack down` read its
    ports from its state and must never refuse them."""
    f = tmp_path / "stack.yml"
    f.write_text(FAST_WEB.replace("${WEB_PORT}", "${WEB_PORT:-0}"))
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / "state"))
    cli = [sys.executable, "-m", "chaos.cli", "stack"]
    r = subprocess.run([*cli, "up", str(f)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    import json

    (state,) = (tmp_path / "state" / "stacks").glob("*/state.json")
    port = int(json.loads(state.read_text())["env"]["WEB_PORT"])
    assert ports.claim(port, "stack:someone-else")
    try:
        for cmd in ("status", "down"):
            r = subprocess.run([*cli, cmd, str(f)], env=env, capture_output=True, text=True, timeout=120)
            out = " ".join((r.stdout + r.stderr).split())
            assert r.returncode == 0 and "claimed" not in out, out
        assert "is down" in out
    finally:
        ports.release([port], "stack:someone-else")


DIES_HOLDING = "from chaos.stack import ports; import os, sys; assert ports.claim(int(sys.argv[1]), 'stack:/dead/run'); os._exit(0)"


def test_claim_files_of_ended_holders_are_removed_and_live_ones_stay(claims):
    """The input that showed it: /tmp/kvchaos-port-claims kept a file per claim forever (461
    after one busy evening). A release deletes its file; files whose holder ended without a
    release (killed runs) are deleted by remove_stale (before a process's first pick, and by
    `kvchaos cleanup`); a claim another live process holds, and this process's own, stay."""
    mine, theirs, *dead = (ports.pick_port("stack:probe") for _ in range(5))
    ports.release([mine, theirs, *dead], "stack:probe")
    assert not any((claims / str(p)).exists() for p in (mine, theirs, *dead))  # a release deletes its file
    for port in dead:  # holders that end without a release
        subprocess.run([sys.executable, "-c", DIES_HOLDING, str(port)], check=True, timeout=60)
        assert (claims / str(port)).exists()
    (claims / "not-a-port").write_text("kept: not a claim file")
    proc = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM.replace("sys.argv[1]", str(theirs))],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert ports.claim(mine, "stack:mine")
        removed, kept = ports.remove_stale()
        assert (removed, kept) == (len(dead), 2)
        assert sorted(os.listdir(claims)) == sorted([str(mine), str(theirs), "not-a-port"])
        assert "owner=stack:/other/run" in (ports.holder(theirs) or "")
        assert not ports.claim(theirs, "stack:mine")  # still theirs
        assert "owner=stack:mine" in (ports.holder(mine) or "")
    finally:
        proc.kill()
        proc.wait()
        ports.release([mine], "stack:mine")
    assert ports.remove_stale() == (1, 0)  # their holder is gone now
    assert os.listdir(claims) == ["not-a-port"]
    for port in dead:  # a removed file's port is claimed afresh
        assert ports.claim(port, "stack:again")
    ports.release(dead, "stack:again")


def test_a_claimer_racing_a_removal_claims_a_fresh_file(claims, monkeypatch):
    """A claimer that opened a claim file just before remove_stale deleted it holds a lock on a
    file that no longer has a name: it notices (the name names another file, or none) and claims
    again on a new file, so no two processes ever hold two files of one name."""
    port = free_port()
    path = claims / str(port)
    path.touch()
    os.chmod(path, 0o666)
    real_open = ports._open_claim
    calls = []

    def open_then_removed(p):
        got = real_open(p)
        if not calls:  # the first open: another process's sweep deletes the file before the lock
            swept = subprocess.run([sys.executable, "-c", "from chaos.stack import ports; print(ports.remove_stale())"],
                                   capture_output=True, text=True, timeout=60, check=True)
            assert swept.stdout.strip() == "(1, 0)"
        calls.append(p)
        return got

    monkeypatch.setattr(ports, "_open_claim", open_then_removed)
    assert ports.claim(port, "stack:race")
    try:
        assert len(calls) == 2  # the first file was found deleted, the second is the claim
        assert "owner=stack:race" in (ports.holder(port) or "")
        assert path.exists()
    finally:
        ports.release([port], "stack:race")


def test_a_process_sweeps_before_its_first_pick_and_cleanup_sweeps_too(claims, tmp_path):
    """Dead claims go without anyone running cleanup: a process's first pick_port deletes them;
    `kvchaos cleanup` does as well, and says so."""
    from typer.testing import CliRunner

    from chaos.cli import app

    first, second = free_port(), free_port()
    for port in (first, second):
        subprocess.run([sys.executable, "-c", DIES_HOLDING, str(port)], check=True, timeout=60)
    picked = subprocess.run([sys.executable, "-c", "from chaos.stack import ports; print(ports.pick_port('stack:p'))"],
                            capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert os.listdir(claims) == [picked]  # the dead two went; the pick's process ended without a release
    subprocess.run([sys.executable, "-c", DIES_HOLDING, str(first)], check=True, timeout=60)
    r = CliRunner().invoke(app, ["cleanup"], env={"KVCHAOS_STATE_DIR": str(tmp_path / "state")})
    assert r.exit_code == 0, r.output
    assert f"port claims: deleted 2 stale files (no process holds them) in {claims}" in r.output
    assert os.listdir(claims) == []
