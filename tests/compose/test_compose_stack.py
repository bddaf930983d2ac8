"""ComposeStack against the real Docker engine: up, health, faults, logs, and teardown that
leaves nothing behind on pass, failure and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chaos.stack.base import StackError
from chaos.stack.compose import (LABEL_RUN, ComposeStack, build_context_tar,
                                 project_name)
from kvchaos_support import default_sigint

REPO = Path(__file__).resolve().parents[2]
NOTHING = {"containers": [], "networks": [], "volumes": []}

pytestmark = pytest.mark.slow


def redis_ping(port: int, timeout_s: float = 1.0) -> bool:
    """True when Redis answers PING on 127.0.0.1:port within timeout_s."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def make_stack(path: Path, tmp_path: Path, env: dict[str, str], sweeper: list[str]) -> ComposeStack:
    stack = ComposeStack(path, run_dir=tmp_path / "run", environ=env)
    sweeper.append(stack.project)
    return stack


@pytest.fixture
def redis_stack(redis_stack_path, stack_env, tmp_path, sweeper) -> ComposeStack:
    """tests/compose/stacks/redis.yml as a ComposeStack (not started)."""
    return make_stack(redis_stack_path, tmp_path, stack_env, sweeper)


def test_up_is_healthy_with_labels_tmpfs_and_run_dir(docker, leftovers, redis_stack):
    stack = redis_stack
    port = int(stack.env["REDIS_PORT"])
    with stack:
        st = stack.status()
        assert {n: (s.state, s.healthy) for n, s in st.items()} == {
            "redis": ("running", True), "web": ("running", True), "sleeper": ("running", True)}
        assert st["redis"].detail["health"] == "healthy"  # Docker ran redis-cli in the container
        # kvchaos probed web from the host; Docker does not health-check it at all
        assert "Health" not in stack.container("web").attrs["State"]
        assert redis_ping(port)
        redis = stack.container("redis")
        assert redis.labels[LABEL_RUN] == stack.run_id
        # tmpfs with a size (what the disk_full fault fills): 8 MiB = 8192 KiB
        rc, out = redis.exec_run(["df", "-k", "/data"])
        assert rc == 0 and out.decode().splitlines()[1].split()[1] == "8192", out
        # ${KVCHAOS_RUN_DIR} is the same path inside and out; $$ reached the shell as $
        assert (stack.run_dir / "sleeper-was-here").read_text().strip() == f"redis://127.0.0.1:{port}"
        # x-kvchaos.l2_fs_size: a 4 MiB tmpfs on the host at l2_fs_path, seen by the containers
        l2 = Path(stack.settings.l2_fs_path)
        assert os.path.ismount(l2)
        (l2 / "from-host").write_text("hello")
        rc, out = redis.exec_run(["sh", "-c", f"df -k {l2} | tail -1; cat {l2}/from-host"])
        assert rc == 0 and out.decode().split()[1] == "4096" and out.decode().endswith("hello"), out
        assert stack.exits == []
    assert leftovers(stack.project) == NOTHING
    assert not os.path.ismount(stack.settings.l2_fs_path)
    logs = stack.run_dir / "logs"
    assert "Ready to accept connections" in (logs / "redis.log").read_text()
    assert (logs / "sleeper.log").exists()


def test_kill_start_restart_and_unexpected_exits(docker, leftovers, redis_stack):
    stack = redis_stack
    port = int(stack.env["REDIS_PORT"])
    with stack:
        stack.kill("redis", "SIGKILL")
        st = stack.status()["redis"]
        assert (st.state, st.returncode) == ("exited", 137)
        assert not redis_ping(port)
        assert [(e.service, e.returncode, e.expected) for e in stack.exits] == [("redis", 137, True)]

        stack.start("redis")
        assert stack.status()["redis"].healthy and redis_ping(port)

        stack.restart("redis")
        assert stack.status()["redis"].healthy and redis_ping(port)
        assert stack.unexpected_exits() == []

        # A death kvchaos did not cause is reported as unexpected (liveness check input).
        stack.container("redis").kill()
        time.sleep(0.5)
        assert [(e.service, e.expected) for e in stack.unexpected_exits()] == [("redis", False)]

        with pytest.raises(StackError, match="unknown service"):
            stack.kill("nope")
    assert leftovers(stack.project) == NOTHING


def test_pause_freezes_and_resume_thaws(docker, leftovers, redis_stack):
    stack = redis_stack
    port = int(stack.env["REDIS_PORT"])
    with stack:
        stack.pause("redis")
        assert stack.status()["redis"].state == "paused"
        assert not redis_ping(port, timeout_s=0.5)  # the kernel accepts, Redis never answers
        stack.resume("redis")
        assert stack.status()["redis"].state == "running"
        assert redis_ping(port)
        stack.pause("redis")  # down() must cope with a paused container
    assert leftovers(stack.project) == NOTHING


def test_exception_inside_with_leaves_nothing(docker, leftovers, redis_stack):
    stack = redis_stack
    with pytest.raises(RuntimeError, match="boom"):
        with stack:
            assert leftovers(stack.project)["containers"]
            raise RuntimeError("boom")
    assert leftovers(stack.project) == NOTHING


def test_keyboard_interrupt_inside_with_leaves_nothing(docker, leftovers, redis_stack):
    stack = redis_stack
    with pytest.raises(KeyboardInterrupt):
        with stack:
            raise KeyboardInterrupt
    assert leftovers(stack.project) == NOTHING


def test_ctrl_c_of_a_real_process_leaves_nothing(docker, leftovers, redis_stack_path, stack_env, tmp_path, sweeper):
    """SIGINT to a process sitting in ``with ComposeStack(...)``: Python raises
    KeyboardInterrupt there and ``__exit__`` tears the stack down."""
    run_id = "ctrlc-" + os.urandom(3).hex()
    sweeper.append(project_name(run_id))
    script = textwrap.dedent(f"""
        import sys, time
        from chaos.stack.compose import ComposeStack
        with ComposeStack({str(redis_stack_path)!r}, run_dir={str(tmp_path / 'run')!r}, run_id={run_id!r}):
            print("up", flush=True)
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=stack_env, cwd=REPO, preexec_fn=default_sigint)
    try:
        assert proc.stdout.readline().strip() == "up"
        assert leftovers(project_name(run_id))["containers"]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)  # a margin for compose down on a loaded machine
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert leftovers(project_name(run_id)) == NOTHING


def _one_service_stack(tmp_path: Path, test_image: str, command: list[str], check: list[str],
                       name: str = "svc") -> Path:
    """A stack file of one network_mode: host service ``name`` with a Docker health check."""
    path = tmp_path / f"{name}.yml"
    path.write_text(textwrap.dedent(f"""
        services:
          {name}:
            image: {test_image}
            network_mode: host
            command: {json.dumps(command)}
            healthcheck: {{test: {json.dumps(check)}, interval: 200ms, timeout: 2s, retries: 50}}
            stop_signal: SIGKILL
    """))
    return path


def test_a_service_that_dies_fails_up_and_is_removed(docker, leftovers, stack_env, tmp_path, sweeper, test_image):
    path = _one_service_stack(tmp_path, test_image, ["/bin/sh", "-c", "echo going away; exit 3"],
                              ["CMD", "true"], name="short")
    stack = make_stack(path, tmp_path, stack_env, sweeper)
    with pytest.raises(StackError, match=r"'short' exited \(code 3\)") as info:
        stack.up()
    assert "going away" in str(info.value)
    assert leftovers(stack.project) == NOTHING


def test_a_missing_proxy_image_runs_kvchaos_own_proxy_command(docker, leftovers, stack_env, tmp_path, sweeper,
                                                              test_image):
    """No registry: the proxy service runs its x-kvchaos-local command in the engine's image."""
    path = tmp_path / "proxy.yml"
    path.write_text(textwrap.dedent(f"""
        x-kvchaos:
          engine: engine
          proxy: {{service: toxiproxy, api: "http://127.0.0.1:${{TOXIPROXY_PORT:-18474}}"}}
        services:
          toxiproxy:
            image: kvchaos-test/not-pulled-here:never
            network_mode: host
            command: ["-host=127.0.0.1", "-port=${{TOXIPROXY_PORT:-18474}}"]
            x-kvchaos-local:
              command: [python3, -m, http.server, --bind, 127.0.0.1, "${{TOXIPROXY_PORT:-18474}}"]
            healthcheck:
              test: [CMD, kvchaos, probe, "http://127.0.0.1:${{TOXIPROXY_PORT:-18474}}/"]
              interval: 200ms
              retries: 50
          engine:
            image: {test_image}
            network_mode: host
            command: [sleep, infinity]
            stop_signal: SIGKILL
            depends_on: {{toxiproxy: {{condition: service_healthy}}}}
    """))
    stack = make_stack(path, tmp_path, stack_env, sweeper)
    with stack:
        assert stack.status()["toxiproxy"].healthy
        proxy = stack.container("toxiproxy")
        assert proxy.attrs["Config"]["Image"] == test_image
        assert proxy.attrs["Config"]["Cmd"][:3] == ["python3", "-m", "http.server"]
    assert leftovers(stack.project) == NOTHING


def test_missing_image_without_build_is_a_clear_error(docker, leftovers, stack_env, tmp_path, sweeper):
    path = tmp_path / "noimage.yml"
    path.write_text("services:\n  a:\n    image: kvchaos-test/does-not-exist:never\n"
                    "    network_mode: host\n    command: [\"true\"]\n")
    stack = make_stack(path, tmp_path, stack_env, sweeper)
    with pytest.raises(StackError, match="is not present and the service has no build"):
        stack.up()
    assert leftovers(stack.project) == NOTHING


def test_kvchaos_cleanup_takes_down_a_project_from_the_journal(docker, leftovers, redis_stack):
    """`kvchaos cleanup` (chaos/cleanup.py) reads the journal entry up() wrote and removes the
    project and the L2 mount."""
    from chaos.cleanup import cleanup

    stack = redis_stack
    stack.up()  # the runner "died" here
    kinds = {e["kind"] for e in stack.journal.open_entries()}
    assert {"compose_project", "mount"} <= kinds
    report = cleanup(force=[stack.run_id])  # this test process is the journal's live owner
    assert report.errors == []
    assert f"removed compose project {stack.project}" in report.undone
    assert leftovers(stack.project) == NOTHING
    assert not os.path.ismount(stack.settings.l2_fs_path)


def test_build_context_leaves_out_venv_and_git(tmp_path):
    """Also the vLLM venv (3.6 GB) and the vLLM image's wheelhouse: before they were left out,
    a build in a checkout with `make setup-vllm` done sent .venv-vllm with the context."""
    ctx = tmp_path / "ctx"
    for rel in ["compose/Dockerfile", "chaos/__init__.py", ".venv/lib/big.so", ".git/HEAD",
                "chaos/__pycache__/x.pyc", "kvchaos.egg-info/PKG-INFO", ".venv-vllm/lib/big.so",
                "compose/wheelhouse-vllm/torch-2.13.0-py3-none-any.whl"]:
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / rel).write_text("x")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "a-1.0-py3-none-any.whl").write_text("x")
    import tarfile
    with build_context_tar(ctx, "compose/Dockerfile", wheels) as f, tarfile.open(fileobj=f) as tar:
        names = set(tar.getnames())
    assert {"compose/Dockerfile", "chaos/__init__.py", ".kvchaos-wheelhouse/a-1.0-py3-none-any.whl"} <= names
    assert not {n for n in names if n.startswith((".venv", ".git", "kvchaos.egg-info", "compose/wheelhouse"))
                or "__pycache__" in n}


def test_stack_cli_drives_a_compose_stack_across_processes(stack_env, leftovers, redis_stack_path, sweeper):
    """`kvchaos stack up --backend compose FILE`, then `stack status` and `stack down` from other
    processes: they find the compose project from state.json, and down leaves nothing."""
    import json

    kvchaos = [sys.executable, "-m", "chaos.cli", "stack"]

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*kvchaos, *args], env=stack_env, capture_output=True, text=True,
                              timeout=300, cwd=REPO)

    r = cli("up", "--backend", "compose", str(redis_stack_path))
    state_files = list((Path(stack_env["KVCHAOS_STATE_DIR"]) / "stacks").glob("redis-*/state.json"))
    assert len(state_files) == 1, r.stdout + r.stderr
    state = json.loads(state_files[0].read_text())
    sweeper.append(state["project"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert state["backend"] == "compose"
    r = cli("status", "--json", str(redis_stack_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert {n: s["state"] for n, s in json.loads(r.stdout).items()} == {
        "redis": "running", "web": "running", "sleeper": "running"}
    assert redis_ping(int(state["env"]["REDIS_PORT"]))
    r = cli("down", str(redis_stack_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert leftovers(state["project"]) == NOTHING
    assert not state_files[0].exists()
    assert "is not up" in cli("status", str(redis_stack_path)).stderr


def test_stack_cli_refuses_service_subsets_under_compose(redis_stack_path, tmp_path):
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "stack", "up", "--backend", "compose",
                        "--service", "redis", str(redis_stack_path)],
                       env={**os.environ, "KVCHAOS_STATE_DIR": str(tmp_path)}, capture_output=True,
                       text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and "local backend only" in r.stderr


def _stranger() -> socket.socket:
    """A listening socket of this test process: the "other program" that holds a port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.skipif(os.geteuid() != 0, reason="reading other processes' sockets needs root")
def test_a_host_probe_answered_by_a_process_outside_the_container_fails_up(
        docker, leftovers, stack_env, tmp_path, sweeper, test_image):
    """The shared-host collision under --backend compose: the container never bound its port
    (here it does not even try) and another program's socket answered kvchaos's probe from the
    host. up must fail naming the holder, never take the stranger for the service."""
    other = _stranger()
    port = other.getsockname()[1]
    try:
        path = _one_service_stack(tmp_path, test_image, ["sleep", "infinity"],
                               ["CMD", "kvchaos", "probe", f"tcp://127.0.0.1:${{SVC_PORT:-{port}}}"])
        stack = make_stack(path, tmp_path, dict(stack_env, SVC_PORT=str(port)), sweeper)
        with pytest.raises(StackError, match=f"was answered by pid {os.getpid()}") as info:
            stack.up()
        assert f"port {port} (SVC_PORT)" in str(info.value) and info.value.service == "svc"
        assert leftovers(stack.project) == NOTHING
    finally:
        other.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="reading other processes' sockets needs root")
def test_a_docker_health_check_answered_by_a_process_outside_the_stack_fails_up(
        docker, leftovers, stack_env, tmp_path, sweeper, test_image):
    """Docker runs this check inside a network_mode: host container, so a host process holding
    the port the check names answers it just the same: up must look at who listens there."""
    other = _stranger()
    port = other.getsockname()[1]
    try:
        check = ["CMD", "python3", "-c",
                 f"import socket; socket.create_connection(('127.0.0.1', ${{SVC_PORT:-{port}}}), 1)"]
        path = _one_service_stack(tmp_path, test_image, ["sleep", "infinity"], check)
        stack = make_stack(path, tmp_path, dict(stack_env, SVC_PORT=str(port)), sweeper)
        with pytest.raises(StackError, match=f"port {port} \\(SVC_PORT\\) is held by pid {os.getpid()}") as info:
            stack.up()
        assert "not by this stack's containers" in str(info.value)
        assert leftovers(stack.project) == NOTHING
    finally:
        other.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="reading other processes' sockets needs root")
def test_a_lost_bind_names_the_process_that_holds_the_port(docker, leftovers, stack_env, tmp_path, sweeper,
                                                           test_image):
    """redis-server in the container exits on EADDRINUSE: the error says who holds the port."""
    other = _stranger()
    port = other.getsockname()[1]
    try:
        path = _one_service_stack(tmp_path, test_image,
                               ["redis-server", "--port", f"${{SVC_PORT:-{port}}}", "--bind", "127.0.0.1"],
                               ["CMD", "redis-cli", "-p", f"${{SVC_PORT:-{port}}}", "ping"])
        stack = make_stack(path, tmp_path, dict(stack_env, SVC_PORT=str(port)), sweeper)
        with pytest.raises(StackError, match="exited \\(code 1\\) before it became healthy") as info:
            stack.up()
        assert f"port {port} (SVC_PORT) is held by pid {os.getpid()}" in str(info.value)
        assert "(a lost bind)" in str(info.value)
        assert leftovers(stack.project) == NOTHING
    finally:
        other.close()


def test_the_stacks_own_containers_pass_the_identity_checks(docker, leftovers, redis_stack):
    """Both kinds of check (kvchaos's host probe of web, Docker's redis-cli in redis) find the
    listening socket in the stack's own containers."""
    with redis_stack as stack:
        for name in ("redis", "web"):
            pids = stack.service_pids(name)
            assert pids and pids <= stack.own_pids()
        assert stack.service_pids("sleeper") is None  # its own network namespace: not checkable
        assert stack.foreign_listeners("redis") == [] and stack.foreign_listeners("web") == []


def test_reconfigure_restarts_a_changed_service_with_its_new_environment(docker, leftovers, stack_env, tmp_path,
                                                                         sweeper, test_image):
    """``reconfigure`` under compose (the suite's engine restart when the next scenario's
    ``KVCHAOS_ENGINE_BUGS`` differs): the service restarts with the new value. Input: the stopped
    container was started again as it was created, so a bug planted for one scenario stayed
    planted in the next one's engine."""
    path = tmp_path / "greet.yml"
    path.write_text(textwrap.dedent(f"""
        services:
          greeter:
            image: {test_image}
            network_mode: host
            environment: {{GREETING: "${{GREETING:-hello}}"}}
            command: [sleep, infinity]
            stop_signal: SIGKILL
          bystander:
            image: {test_image}
            network_mode: host
            command: [sleep, infinity]
            stop_signal: SIGKILL
    """))
    stack = make_stack(path, tmp_path, stack_env, sweeper)

    def greeting() -> str:
        rc, out = stack.container("greeter").exec_run(["sh", "-c", "echo $GREETING"])
        assert rc == 0, out
        return out.decode().strip()

    with stack:
        assert greeting() == "hello"
        bystander = stack.container("bystander").id
        assert stack.reconfigure({"GREETING": "bye"}) == ["greeter"]
        assert greeting() == "bye"
        assert stack.container("bystander").id == bystander  # what did not change stays up
        assert stack.unexpected_exits() == []
        assert sorted(stack.reconfigure({"GREETING": "hello"}, restart=["bystander"])) == ["bystander", "greeter"]
        assert greeting() == "hello" and stack.container("bystander").id == bystander
    assert leftovers(stack.project) == NOTHING
    assert list((stack.run_dir / "logs").glob("greeter.*.log"))  # the replaced containers' logs
