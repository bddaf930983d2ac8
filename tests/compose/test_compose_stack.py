"""ComposeStack against the real Docker engine: up, health, faults, logs, and teardown that
leaves nothing behind on pass, failure and Ctrl-C."""

from __future__ import annotations

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
from chaos.stack.compose import (LABEL_RUN, ComposeStack, build_context_tar, cleanup_all,
                                 project_name)

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


def test_up_is_healthy_with_labels_tmpfs_and_run_dir(docker, leftovers, redis_stack_path, stack_env, tmp_path, sweeper):
    stack = make_stack(redis_stack_path, tmp_path, stack_env, sweeper)
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
        assert stack.exits == []
    assert leftovers(stack.project) == NOTHING
    logs = stack.run_dir / "logs"
    assert "Ready to accept connections" in (logs / "redis.log").read_text()
    assert (logs / "sleeper.log").exists()


def test_kill_start_restart_and_unexpected_exits(docker, leftovers, redis_stack_path, stack_env, tmp_path, sweeper):
    stack = make_stack(redis_stack_path, tmp_path, stack_env, sweeper)
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


def test_pause_freezes_and_resume_thaws(docker, leftovers, redis_stack_path, stack_env, tmp_path, sweeper):
    stack = make_stack(redis_stack_path, tmp_path, stack_env, sweeper)
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


def test_exception_inside_with_leaves_nothing(docker, leftovers, redis_stack_path, stack_env, tmp_path, sweeper):
    stack = make_stack(redis_stack_path, tmp_path, stack_env, sweeper)
    with pytest.raises(RuntimeError, match="boom"):
        with stack:
            assert leftovers(stack.project)["containers"]
            raise RuntimeError("boom")
    assert leftovers(stack.project) == NOTHING


def test_keyboard_interrupt_inside_with_leaves_nothing(docker, leftovers, redis_stack_path, stack_env, tmp_path, sweeper):
    stack = make_stack(redis_stack_path, tmp_path, stack_env, sweeper)
    with pytest.raises(KeyboardInterrupt):
        with stack:
            raise KeyboardInterrupt
    assert leftovers(stack.project) == NOTHING


def test_ctrl_c_of_a_real_process_leaves_nothing(docker, leftovers, redis_stack_path, stack_env, tmp_path):
    """SIGINT to a process sitting in ``with ComposeStack(...)``: Python raises
    KeyboardInterrupt there and ``__exit__`` tears the stack down."""
    run_id = "ctrlc-" + os.urandom(3).hex()
    script = textwrap.dedent(f"""
        import sys, time
        from chaos.stack.compose import ComposeStack
        with ComposeStack({str(redis_stack_path)!r}, run_dir={str(tmp_path / 'run')!r}, run_id={run_id!r}):
            print("up", flush=True)
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=stack_env, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == "up"
        assert leftovers(project_name(run_id))["containers"]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert leftovers(project_name(run_id)) == NOTHING


def test_a_service_that_dies_fails_up_and_is_removed(docker, leftovers, stack_env, tmp_path, sweeper, test_image):
    path = tmp_path / "dies.yml"
    path.write_text(textwrap.dedent(f"""
        services:
          short:
            image: {test_image}
            network_mode: host
            command: ["/bin/sh", "-c", "echo going away; exit 3"]
            healthcheck: {{test: ["CMD", "true"], interval: 200ms, retries: 20}}
    """))
    stack = make_stack(path, tmp_path, stack_env, sweeper)
    with pytest.raises(StackError, match=r"'short' exited \(code 3\)") as info:
        stack.up()
    assert "going away" in str(info.value)
    assert leftovers(stack.project) == NOTHING


def test_missing_image_without_build_is_a_clear_error(docker, leftovers, stack_env, tmp_path, sweeper):
    path = tmp_path / "noimage.yml"
    path.write_text("services:\n  a:\n    image: kvchaos-test/does-not-exist:never\n"
                    "    network_mode: host\n    command: [\"true\"]\n")
    stack = make_stack(path, tmp_path, stack_env, sweeper)
    with pytest.raises(StackError, match="is not present and the service has no build"):
        stack.up()
    assert leftovers(stack.project) == NOTHING


def test_cleanup_all_removes_what_a_dead_runner_left(docker, leftovers, redis_stack_path, stack_env, tmp_path, sweeper):
    stack = make_stack(redis_stack_path, tmp_path, stack_env, sweeper)
    stack.up()  # and never down(): the runner "died"
    assert leftovers(stack.project)["volumes"]
    removed = cleanup_all(docker)
    assert len([c for c in removed["containers"] if c.startswith(stack.project)]) == 3
    assert leftovers(stack.project) == NOTHING
    assert not docker.containers.list(all=True, filters={"label": LABEL_RUN})


def test_build_context_leaves_out_venv_and_git(tmp_path):
    ctx = tmp_path / "ctx"
    for rel in ["compose/Dockerfile", "chaos/__init__.py", ".venv/lib/big.so", ".git/HEAD",
                "chaos/__pycache__/x.pyc", "kvchaos.egg-info/PKG-INFO"]:
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / rel).write_text("x")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "a-1.0-py3-none-any.whl").write_text("x")
    import tarfile
    with build_context_tar(ctx, "compose/Dockerfile", wheels) as f, tarfile.open(fileobj=f) as tar:
        names = set(tar.getnames())
    assert {"compose/Dockerfile", "chaos/__init__.py", ".kvchaos-wheelhouse/a-1.0-py3-none-any.whl"} <= names
    assert not {n for n in names if n.startswith((".venv", ".git", "kvchaos.egg-info")) or "__pycache__" in n}
