"""LocalStack with small real processes: order, health, signals, and a down that leaves nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from chaos.journal import open_entries
from chaos.stack.base import StackError
from chaos.stack.local import LocalStack

REPO = Path(__file__).resolve().parents[2]
KVCHAOS = [sys.executable, "-m", "chaos.cli"]

STACK = """
x-kvchaos:
  engine: web
services:
  web:
    command: [python, -m, http.server, "${WEB_PORT:-0}", --bind, 127.0.0.1]
    healthcheck:
      test: [CMD, kvchaos, probe, "http://127.0.0.1:${WEB_PORT:-0}/"]
      interval: 100ms
      retries: 100
  worker:
    # A parent with a child in the same process group: both must go on kill and down.
    command: "sh -c 'sleep 300 & echo started; wait'"
    depends_on:
      web: {condition: service_healthy}
  tcp:
    command: [python, -c, "import socket,time; s=socket.socket(); s.bind(('127.0.0.1', ${TCP_PORT:-0})); s.listen(); time.sleep(300)"]
    healthcheck:
      test: [CMD, kvchaos, probe, "tcp://127.0.0.1:${TCP_PORT:-0}"]
      interval: 100ms
      retries: 100
"""


def group_pids(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def stack_file(tmp_path: Path) -> Path:
    p = tmp_path / "stack.yml"
    p.write_text(STACK)
    return p


def test_up_down_leaves_nothing(stack_file, tmp_path):
    stack = LocalStack(stack_file, run_dir=tmp_path / "run", environ=dict(os.environ))
    with stack:
        st = stack.status()
        assert {s.state for s in st.values()} == {"running"}
        web_port = int(stack.env["WEB_PORT"])
        assert port_in_use(web_port)
        pgids = {n: s.detail["pgid"] for n, s in st.items()}
        assert len(group_pids(pgids["worker"])) >= 2  # sh and its sleep child
        # every process is in the journal before it is relied on
        assert {e["service"] for e in open_entries(stack.journal.path)} == {"web", "worker", "tcp"}
        assert (stack.log_dir / "worker.log").read_text().splitlines().count("started") == 1
    for pgid in pgids.values():
        assert group_pids(pgid) == []
    assert not port_in_use(web_port)
    assert not port_in_use(int(stack.env["TCP_PORT"]))
    assert open_entries(stack.journal.path) == []


def test_kill_pause_resume_restart(stack_file, tmp_path):
    stack = LocalStack(stack_file, run_dir=tmp_path / "run", environ=dict(os.environ))
    with stack:
        pgid = stack.status()["worker"].detail["pgid"]
        stack.kill("worker", "SIGKILL")
        assert group_pids(pgid) == []
        assert stack.status()["worker"].state == "exited"
        assert stack.unexpected_exits() == []  # kvchaos killed it on purpose
        stack.start("worker")
        assert stack.status()["worker"].state == "running"

        stack.pause("web")
        web = psutil.Process(stack.pids()["web"])
        assert web.status() == psutil.STATUS_STOPPED
        assert stack.status()["web"].state == "paused"
        stack.resume("web")
        assert web.status() != psutil.STATUS_STOPPED
        old = stack.pids()["web"]
        stack.restart("web")
        assert stack.pids()["web"] != old
        stack.wait_healthy("web", timeout_s=10)


def test_unexpected_exit_is_reported(stack_file, tmp_path):
    stack = LocalStack(stack_file, run_dir=tmp_path / "run", environ=dict(os.environ))
    with stack:
        os.killpg(stack.status()["tcp"].detail["pgid"], signal.SIGKILL)  # not through kvchaos
        time.sleep(0.3)
        exits = stack.unexpected_exits()
        assert [e.service for e in exits] == ["tcp"]
        assert exits[0].returncode == -signal.SIGKILL


def test_unhealthy_service_fails_with_log_tail_and_cleans_up(tmp_path):
    p = tmp_path / "stack.yml"
    p.write_text(textwrap.dedent("""
        services:
          ok:
            command: [sleep, "300"]
          broken:
            command: [python, -c, "print('boom: cannot bind'); import time; time.sleep(300)"]
            healthcheck: {test: [CMD, kvchaos, probe, "tcp://127.0.0.1:1"], interval: 100ms, timeout: 200ms, retries: 5}
    """))
    stack = LocalStack(p, run_dir=tmp_path / "run", environ=dict(os.environ))
    with pytest.raises(StackError) as info:
        stack.up()
    assert "broken" in str(info.value) and "not healthy" in str(info.value)
    assert "boom: cannot bind" in str(info.value)
    for name, proc in stack._procs.items():
        assert group_pids(proc.pgid) == [], name


def test_service_that_exits_fails_fast(tmp_path):
    p = tmp_path / "stack.yml"
    p.write_text(textwrap.dedent("""
        services:
          dies:
            command: [python, -c, "import sys; print('fatal: bad flag'); sys.exit(3)"]
            healthcheck: {test: [CMD, kvchaos, probe, "tcp://127.0.0.1:1"], interval: 100ms, retries: 600}
    """))
    stack = LocalStack(p, run_dir=tmp_path / "run", environ=dict(os.environ))
    t0 = time.monotonic()
    with pytest.raises(StackError, match="exited \\(code 3\\)") as info:
        stack.up()
    assert time.monotonic() - t0 < 10
    assert "fatal: bad flag" in str(info.value)


def test_missing_program_is_a_config_error_before_anything_starts(tmp_path):
    p = tmp_path / "stack.yml"
    p.write_text(textwrap.dedent("""
        services:
          fine:
            command: [sleep, "300"]
          typo:
            command: [redis-servre, --port, "1"]
    """))
    r = subprocess.run(KVCHAOS + ["stack", "up", str(p)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert f"{p}:6" in r.stderr and "typo" in r.stderr and "redis-servre" in r.stderr
    assert not [q for q in psutil.process_iter(["cmdline"]) if q.info["cmdline"] == ["sleep", "300"]
                and q.parent() and q.parent().pid == os.getpid()]


def test_cli_up_status_down_detached(stack_file):
    env = dict(os.environ)
    r = subprocess.run(KVCHAOS + ["stack", "up", str(stack_file)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    try:
        r = subprocess.run(KVCHAOS + ["stack", "status", "--json", str(stack_file)], capture_output=True,
                           text=True, env=env)
        assert r.returncode == 0, r.stderr
        import json

        st = json.loads(r.stdout)
        assert {v["state"] for v in st.values()} == {"running"}
        pids = [v["pid"] for v in st.values()]
    finally:
        r = subprocess.run(KVCHAOS + ["stack", "down", str(stack_file)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    for pid in pids:
        assert group_pids(pid) == []


def test_health_check_answered_by_another_process_is_an_error(tmp_path):
    """On a shared host another stack may hold the port a service was given: its health check
    then passes on the other process, and the run would test the wrong server. (Seen here: a
    second LMCache failed to bind 25555 while the first answered its /healthcheck.)"""
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    port = other.getsockname()[1]
    p = tmp_path / "stack.yml"
    p.write_text(textwrap.dedent(f"""
        services:
          late:
            command: [sleep, "300"]
            healthcheck: {{test: [CMD, kvchaos, probe, "tcp://127.0.0.1:{port}"], interval: 100ms, retries: 50}}
    """))
    stack = LocalStack(p, run_dir=tmp_path / "run", environ=dict(os.environ))
    try:
        if os.geteuid() != 0:
            pytest.skip("reading other processes' sockets needs root")
        with pytest.raises(StackError, match="was answered by pid") as info:
            stack.up()
        assert f"pid {os.getpid()}" in str(info.value)
        for name, proc in stack._procs.items():
            assert group_pids(proc.pgid) == [], name
    finally:
        stack.down()
        other.close()


SOCKET_STACK = """
x-kvchaos:
  engine: sock
services:
  sock:
    # binds a Unix socket the way vLLM's IPC does (a uuid4 name under a folder it is given)
    command: [python, -c, "import os,socket,time,uuid; d=os.environ['D']; os.makedirs(d, exist_ok=True); s=socket.socket(socket.AF_UNIX); s.bind(os.path.join(d, str(uuid.uuid4()))); print('bound', flush=True); time.sleep(300)"]
    environment:
      D: ${KVCHAOS_SOCKET_DIR}
"""


def test_sockets_a_killed_service_left_are_removed_at_down_however_deep_the_run_dir(tmp_path):
    """The input that showed it: vLLM's ZeroMQ IPC sockets (``/tmp/<uuid4>``) that every killed or
    restarted vLLM left behind, 390 in /tmp after one day (2026-12-07); under the run dir they
    would not fit ``sun_path`` (a CI report folder is already 100 characters deep)."""
    from chaos.stack.spec import SUN_PATH_MAX, socket_dir

    p = tmp_path / "stack.yml"
    p.write_text(SOCKET_STACK)
    run_dir = tmp_path / ("d" * 60) / ("e" * 60) / "run"
    stack = LocalStack(p, run_dir=run_dir, environ=dict(os.environ))
    folder = socket_dir(run_dir)
    assert stack.env["KVCHAOS_SOCKET_DIR"] == str(folder) and len(str(folder)) + 1 + 36 <= SUN_PATH_MAX
    assert socket_dir(run_dir) != socket_dir(tmp_path / "other")  # one folder per stack
    with stack:
        deadline = time.monotonic() + 30
        while "bound" not in (stack.log_dir / "sock.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        stack.kill("sock", "SIGKILL")  # a node exit: nothing unlinks the socket
        assert len(list(folder.iterdir())) == 1
        assert str(folder) in {e.get("path") for e in open_entries(stack.journal.path)}
    assert not folder.exists()
    assert open_entries(stack.journal.path) == []


def test_cleanup_removes_the_socket_folder_of_a_crashed_run(tmp_path):
    from chaos.cleanup import _remove_file

    folder = tmp_path / "kvchaos-sock-x"
    folder.mkdir()
    (folder / "s").write_text("")
    assert _remove_file({"path": str(folder)}) == f"removed {folder}"
    assert not folder.exists()
