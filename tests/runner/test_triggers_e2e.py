"""A trigger through `kvchaos run` on a small real stack (Redis behind the fault proxy, a pinger
making traffic): the fault acts, one trigger condition is reached and one is not, so the run is
inconclusive (exit 4) and says which; the same run without the unreachable condition passes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.slow


def run(tmp_path: Path, text: str) -> tuple[int, dict]:
    for name in ("proxy-redis.yml",):
        shutil.copy(DATA / name, tmp_path / name)
    (tmp_path / "s.yaml").write_text(text)
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "run", str(tmp_path / "s.yaml"),
                        "--report-dir", str(tmp_path / "reports")], env=env, capture_output=True, text=True,
                       timeout=240)
    (result,) = list((tmp_path / "reports").glob("trigger-reached-or-not-*/result.json"))
    return r.returncode, json.loads(result.read_text())


def test_trigger_not_reached_is_inconclusive_and_reached_passes(tmp_path):
    text = (DATA / "trigger-reached-or-not.yaml").read_text()
    (tmp_path / "a").mkdir()
    code, result = run(tmp_path / "a", text)
    assert code == 4
    (ev,) = [c for c in result["checks"] if c["name"] == "evidence"]
    assert ev["verdict"] == "unknown"
    assert "faults acted: 1 of 1; triggers reached: 0 of 1" in ev["summary"]
    assert "redis log /a line redis never writes/" in ev["summary"]
    (row,) = ev["details"]["faults"]
    conds = row["trigger"]["conditions"]
    assert [c["reached"] for c in conds] == [True, False] and conds[0]["max"] == 50

    (tmp_path / "b").mkdir()
    code, result = run(tmp_path / "b", text.replace('          - {log: "a line redis never writes", service: redis}\n', ""))
    (ev,) = [c for c in result["checks"] if c["name"] == "evidence"]
    assert code == 0, ev["summary"]
    assert ev["summary"] == "faults acted: 1 of 1 (slow-link); triggers reached: 1 of 1"
