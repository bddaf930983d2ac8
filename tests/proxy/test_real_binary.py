"""The real Toxiproxy's binary as a stack finds it: checked to be Toxiproxy before anything
starts, handed to the service as an absolute path, and named in the run's report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chaos.proxy.real import BIN_ENV, MissingToxiproxy, binary_version, find_binary, verified_binary
from chaos.stack.local import LocalStack
from chaos.stack.spec import free_port
from kvchaos_support import needs_real_toxiproxy

REPO = Path(__file__).resolve().parents[2]


def _stack(tmp_path: Path, impl: str) -> Path:
    api = free_port()
    p = tmp_path / "stack.yml"
    p.write_text(textwrap.dedent(f"""
        x-kvchaos:
          proxy: {{service: toxiproxy, api: "http://127.0.0.1:{api}"}}
        services:
          toxiproxy:
            command: [kvchaos, proxy, serve, --host, 127.0.0.1, --port, "{api}", --impl, {impl}]
            healthcheck: {{test: [CMD, kvchaos, probe, "http://127.0.0.1:{api}/version"], interval: 100ms, retries: 100}}
    """))
    return p


def test_a_file_that_is_not_toxiproxy_is_refused_with_what_it_printed(tmp_path):
    fake = tmp_path / "toxiproxy-server"
    fake.write_text("#!/bin/sh\necho 'usage: something else' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(MissingToxiproxy, match="is not Toxiproxy.*exited 1.*usage: something else"):
        verified_binary({BIN_ENV: str(fake)})
    with pytest.raises(MissingToxiproxy, match="is not Toxiproxy"):
        binary_version(Path("/bin/true"))  # exits 0 and prints nothing
    with pytest.raises(MissingToxiproxy, match="not an executable file"):
        find_binary({BIN_ENV: str(tmp_path / "absent")})


def test_a_stand_in_that_answers_like_toxiproxy_gives_its_version(tmp_path):
    fake = tmp_path / "toxiproxy-server"
    fake.write_text("#!/bin/sh\necho 'toxiproxy-server version 2.12.0'\n")
    fake.chmod(0o755)
    assert verified_binary({BIN_ENV: str(fake)}) == (fake.resolve(), "2.12.0")


def test_a_wrong_binary_stops_a_local_stack_before_it_starts(tmp_path):
    """Exit 2 naming the stack file's line, not a proxy that never becomes healthy."""
    p = _stack(tmp_path, "real")
    env = dict(os.environ, **{BIN_ENV: "/bin/true", "KVCHAOS_STATE_DIR": str(tmp_path / "state")})
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "stack", "up", str(p)], capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "/bin/true is not Toxiproxy" in r.stderr and f"{p}:" in r.stderr


@needs_real_toxiproxy
def test_a_relative_binary_path_works_from_the_services_own_directory(tmp_path):
    """The input that showed it: KVCHAOS_TOXIPROXY_BIN=../shared/tools/toxiproxy/toxiproxy-server
    (relative to the checkout) named a file for the runner but not for the proxy service, which
    runs in its own directory: the stack's proxy never started."""
    real = find_binary()
    (tmp_path / "bin").mkdir()
    shutil.copy(real, tmp_path / "bin" / "toxiproxy-server")
    p = _stack(tmp_path, "real")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        stack = LocalStack(p, run_dir=tmp_path / "run",
                           environ=dict(os.environ, **{BIN_ENV: "bin/toxiproxy-server"}))
    finally:
        os.chdir(cwd)
    assert stack.env[BIN_ENV] == str((tmp_path / "bin" / "toxiproxy-server").resolve())
    try:
        stack.up()
        info = stack.proxy_info()
        assert info["impl"] == "real" and info["version"] == binary_version(real)
        assert info["binary"] == stack.env[BIN_ENV]
        log = (stack.log_dir / "toxiproxy.log").read_text()
        assert "kvchaos proxy: exec " in log and stack.env[BIN_ENV] in log
    finally:
        stack.down()


def test_the_bundled_proxy_is_named_as_such(tmp_path):
    p = _stack(tmp_path, "bundled")
    stack = LocalStack(p, run_dir=tmp_path / "run", environ=dict(os.environ))
    info = stack.proxy_info()
    assert info["impl"] == "bundled" and info["api"].startswith("http://127.0.0.1:")
    assert json.loads(json.dumps(info)) == info
