"""``python -m chaos.proxy``: port 0 reporting, --config, loopback guard, exit codes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from chaos.proxy.client import ToxiproxyClient


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "chaos.proxy", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert "API listening on http://127.0.0.1:" in line, (line, proc.stderr.read())
    return proc, line.rsplit(" ", 1)[1].strip()


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    assert proc.wait(10) == 0


def test_serve_with_config_then_sigterm(tmp_path, echo_upstream, net):
    config = tmp_path / "toxiproxy.json"
    config.write_text(json.dumps([
        {"name": "echo", "listen": "127.0.0.1:0", "upstream": echo_upstream.address},
        {"name": "idle", "listen": "127.0.0.1:0", "upstream": echo_upstream.address,
         "enabled": False}]))
    for argv in (["--port", "0"], ["serve", "--port", "0", "--loop", "asyncio"]):
        proc, url = start(*argv, "--config", str(config), "--seed", "3")
        try:
            with ToxiproxyClient(url) as c:
                proxies = c.proxies()
                assert set(proxies) == {"echo", "idle"}
                assert proxies["idle"].enabled is False
                s = net.connect(proxies["echo"].listen)
                s.sendall(b"hi")
                assert net.recv_exact(s, 2) == b"hi"
                s.close()
        finally:
            stop(proc)


@pytest.mark.parametrize("content, message", [
    ("[{\"name\": \"x\"}]", "missing required field: upstream"),
    ("{oops", "Invalid JSON"),
])
def test_bad_config_exits_2(tmp_path, content, message):
    config = tmp_path / "c.json"
    config.write_text(content)
    r = subprocess.run([sys.executable, "-m", "chaos.proxy", "--port", "0", "--config",
                        str(config)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert message in r.stderr and "kvchaos proxy:" in r.stderr


def test_non_loopback_api_refused_without_allow_remote():
    r = subprocess.run([sys.executable, "-m", "chaos.proxy", "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--allow-remote" in r.stderr


def test_api_port_in_use_exits_3():
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        r = subprocess.run([sys.executable, "-m", "chaos.proxy", "--port", str(port)],
                           capture_output=True, text=True, timeout=30)
    finally:
        taken.close()
    assert r.returncode == 3 and "cannot listen" in r.stderr


def test_typer_app_has_serve_command():
    from typer.testing import CliRunner

    from chaos.proxy.cli import app

    result = CliRunner().invoke(app, ["serve", "--help"])
    assert result.exit_code == 0 and "--allow-remote" in result.output
