"""`kvchaos run` reaches validation with every option it takes (a merge once left `_run` reading
options it was not given: every run died with a NameError before anything was checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("extra", [[], ["--proxy", "bundled", "--numerics", "exact", "--equivalence", "exact",
                                        "--diagnose", "0"]])
def test_run_of_an_invalid_scenario_exits_2_naming_the_line(tmp_path: Path, extra: list[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nstack: nowhere.yml\nphases: [{name: p}]\nchecks: {liveness: {}}\nworkload: {requets: 1}\n")
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "run", str(bad), "--report-dir", str(tmp_path / "r"),
                        *extra], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "NameError" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"{bad}:5: workload.requets" in r.stderr, r.stderr[-2000:]
