"""Stack file loading: interpolation, free ports, and errors that name file, line and service."""

from __future__ import annotations

import socket
import textwrap
from pathlib import Path

import pytest

from chaos.stack.interpolate import InterpolationError, interpolate
from chaos.stack.spec import load_stack, parse_compose_duration
from chaos.yamlsource import ConfigError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "stack.yml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize("text,env,expected", [
    ("${A}", {"A": "1"}, "1"),
    ("${B:-x}", {}, "x"),
    ("${B:-x}", {"B": ""}, "x"),
    ("${B-x}", {"B": ""}, ""),
    ("${B:-${A}2}", {"A": "1"}, "12"),
    ("$$A", {"A": "1"}, "$A"),
    ("$A/b", {"A": "1"}, "1/b"),
    ("${MISSING}", {}, ""),
    ('{"port": ${P:-5}}', {}, '{"port": 5}'),
])
def test_interpolation(text, env, expected):
    assert interpolate(text, env) == expected


def test_required_variable_missing():
    with pytest.raises(InterpolationError, match="NEED"):
        interpolate("${NEED:?set it}", {})


@pytest.mark.parametrize("value,seconds", [("500ms", 0.5), ("2s", 2), ("1m30s", 90), (3, 3.0), ("1h", 3600)])
def test_durations(value, seconds):
    assert parse_compose_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["abc", "-1s", -1, "", True])
def test_bad_durations(value):
    with pytest.raises(ValueError):
        parse_compose_duration(value)


def test_reference_stack_is_valid():
    spec = load_stack(REPO / "compose/reference.yml", run_dir=Path("/tmp/x"))
    assert set(spec.services) == {"redis", "toxiproxy", "lmcache", "lmcache-witness", "engine", "engine-recompute"}
    assert set(spec.settings.links) == {"engine-lmcache", "lmcache-redis"}
    # Variables resolve consistently: the engine talks to the proxy's listen port for LMCache.
    link = spec.settings.links["engine-lmcache"]
    assert f"tcp://{link.listen}" in spec.services["engine"].argv()
    assert spec.settings.l2_fs_path == "/tmp/x/l2fs"
    assert spec.start_order()[0] == ["lmcache-witness", "redis", "toxiproxy"]
    # The twin stores (never loads) into the witness LMCache only, and never gets planted bugs.
    twin = spec.services["engine-recompute"]
    assert "kv_producer" in twin.argv() and f"tcp://127.0.0.1:{spec.env['WITNESS_LMCACHE_PORT']}" in twin.argv()
    assert twin.env()["KVCHAOS_ENGINE_BUGS"] == "" and spec.settings.witness.service == "lmcache-witness"
    # The local backend runs kvchaos's proxy; the compose backend the image's entrypoint.
    assert spec.services["toxiproxy"].argv("local")[:3] == ["kvchaos", "proxy", "serve"]
    assert spec.services["toxiproxy"].argv("compose")[0].startswith("-host")


def test_taken_default_port_gets_a_free_one(tmp_path):
    stack = write(tmp_path, """
        services:
          a:
            command: [sleep, "1"]
            environment: {P: "${A_PORT:-0}"}
    """)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        text = stack.read_text().replace("A_PORT:-0", f"A_PORT:-{taken}")
        stack.write_text(text)
        spec = load_stack(stack, environ={})
        port = int(spec.env["A_PORT"])
        assert port != taken and port > 0
        assert spec.services["a"].env()["P"] == str(port)
    # An explicitly set variable is respected as given. The port is one the kernel hands out
    # (its ephemeral range, where kvchaos never picks: chaos/stack/ports.py), not a fixed one:
    # with 4242, a stack of another test of the same `make test` (xdist) or of another run on
    # the host had claimed it, and the loader rightly refused to take it (seen under -n 3).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        mine = s.getsockname()[1]
    spec = load_stack(stack, environ={"A_PORT": str(mine)})
    assert spec.services["a"].env()["P"] == str(mine)


BAD = {
    "unknown key": ("""
        services:
          redis:
            command: [redis-server]
            comand_typo: 1
        """, 5, "redis", "comand_typo"),
    "missing command": ("""
        services:
          redis:
            image: redis
          other:
            command: [sleep, "1"]
        """, 3, "redis", "no command"),
    "bad health check": ("""
        services:
          redis:
            command: [redis-server]
            healthcheck:
              test: [CMDX, redis-cli, ping]
        """, 6, "redis", "CMD"),
    "bad health interval": ("""
        services:
          redis:
            command: [redis-server]
            healthcheck: {test: [CMD, "true"], interval: soon}
        """, 5, "redis", "duration"),
    "unknown dependency": ("""
        services:
          lmcache:
            command: [sleep, "1"]
            depends_on: [redis]
        """, 5, "lmcache", "depends on a service the file does not define"),
    "cycle": ("""
        services:
          a:
            command: [sleep, "1"]
            depends_on: [b]
          b:
            command: [sleep, "1"]
            depends_on: [a]
        """, None, "depends_on", "cycle"),
    "healthy dependency without healthcheck": ("""
        services:
          a:
            command: [sleep, "1"]
          b:
            command: [sleep, "1"]
            depends_on: {a: {condition: service_healthy}}
        """, None, "'a'", "no healthcheck"),
    "x-kvchaos unknown service": ("""
        x-kvchaos:
          engine: nope
        services:
          a:
            command: [sleep, "1"]
        """, 3, "x-kvchaos.engine", "names a service the file does not define"),
    "links without proxy": ("""
        x-kvchaos:
          links:
            l: {listen: "127.0.0.1:1", upstream: "127.0.0.1:2"}
        services:
          a:
            command: [sleep, "1"]
        """, 3, "links", "proxy"),
    "bad link address": ("""
        x-kvchaos:
          proxy: {api: "http://127.0.0.1:8474"}
          links:
            l: {listen: "nowhere", upstream: "127.0.0.1:2"}
        services:
          a:
            command: [sleep, "1"]
        """, 5, "listen", "host:port"),
    "required variable": ("""
        services:
          a:
            command: [sleep, "${NAP:?must be set}"]
        """, 4, "command[1]", "a variable this value requires (${NAME:?...}) is not set"),
    "bad yaml": ("""
        services:
          a:
            command: [sleep, "1"
        """, None, "stack.yml", ""),
    "no services": ("""
        services: {}
        """, 2, "services", "at least one"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_stack_files(tmp_path, case):
    text, line, needle, message = BAD[case]
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_stack(path, environ={})
    err = info.value
    rendered = str(err)
    assert str(path) in rendered
    if line is not None:
        assert err.line == line, rendered
        assert f"{path}:{line}" in rendered
    assert needle in rendered
    assert message in rendered


def test_concurrent_stacks_do_not_pick_the_same_default_port(tmp_path):
    """Two stacks loaded before either binds its ports (the proxy binds a link's port only
    later) must not both take a free default port."""
    import subprocess
    import sys

    from chaos.stack.spec import free_port

    default = free_port()
    stack = write(tmp_path, f"""
        services:
          a:
            command: [sleep, "1"]
            environment: {{P: "${{LINK_PORT:-{default}}}"}}
    """)
    first = load_stack(stack, environ={})
    assert first.env["LINK_PORT"] == str(default)  # free and unclaimed: the default
    # Another process (another kvchaos run) resolving the same file gets another port.
    code = ("import sys; from chaos.stack.spec import load_stack; "
            f"print(load_stack({str(stack)!r}, environ={{}}).env['LINK_PORT'])")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(other.stdout) != default
