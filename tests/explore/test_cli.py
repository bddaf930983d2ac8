"""``kvchaos explore`` refuses bad input with exit 2 before anything starts (no stack, no
report folder)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KVCHAOS = [sys.executable, "-m", "chaos.entry"]


@pytest.mark.parametrize("args, words", [
    (["--stack", "no/such/stack.yml"], "no such file"),
    (["--stack", "compose/reference.yml", "--budget", "soon"], "--budget"),
    (["--stack", "compose/reference.yml", "--budget", "0s"], "more than 0"),
    (["--stack", "compose/reference.yml", "--bug", "no-such-bug"], "unknown --bug"),
    (["--stack", "compose/reference.yml", "--jobs", "0"], "--jobs"),
    (["--stack", "compose/reference.yml", "--jobs", "many"], "--jobs"),
    (["--stack", "scenarios/smoke.yaml"], "--stack"),  # a scenario, not a stack file
])
def test_bad_input_exit_2_nothing_started(args: list[str], words: str, tmp_path: Path) -> None:
    out = tmp_path / "explore"
    done = subprocess.run([*KVCHAOS, "explore", *args, "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not out.exists()
