"""``kvchaos engine ...`` and ``kvchaos proxy ...`` (the services every stack start runs) do not
import ``chaos.cli``: its every-layer commands were 12% of a reference engine's start-up CPU
(py-spy of ``kvchaos engine serve``, 2026-12-07), paid by both engines of every stack start and
restart. Their command lines, help and usage errors stay those of ``kvchaos``."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import atexit, sys
atexit.register(lambda: print("LOADED chaos.cli" if "chaos.cli" in sys.modules else "NO chaos.cli", file=sys.stderr))
sys.argv = ["kvchaos", *sys.argv[1:]]
from chaos.entry import main
main()
"""


def kvchaos(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ["engine", "proxy"])
def test_a_service_command_runs_without_the_cli_of_every_layer(command):
    r = kvchaos(command, "serve", "--help")
    assert r.returncode == 0, r.stderr
    assert f"Usage: kvchaos {command} serve [OPTIONS]" in r.stdout
    assert "NO chaos.cli" in r.stderr
    bad = kvchaos(command, "serve", "--no-such-option")
    assert bad.returncode == 2 and "No such option: --no-such-option" in bad.stderr
    assert f"kvchaos {command} serve --help" in bad.stderr


def test_other_commands_still_go_through_the_cli():
    r = kvchaos("--help")
    assert r.returncode == 0 and "LOADED chaos.cli" in r.stderr
    assert "engine" in r.stdout and "proxy" in r.stdout and "run" in r.stdout
