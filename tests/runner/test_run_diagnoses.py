"""`kvchaos run` diagnoses its failed runs (the after_checks hook, chaos/diagnose/hook.py).

The input that showed it: a merge left chaos/runner/suite.py's run_in_pool calling the runner
without the suite's ``after_checks``, so `kvchaos run --diagnose N` never diagnosed anything
(the zoo and explore hand the hook over themselves and kept working; the diagnose tests call the
runner directly). A failed run of `kvchaos run` must leave its diagnosis.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KVCHAOS = str(Path(sys.executable).with_name("kvchaos"))

pytestmark = pytest.mark.slow


def test_kvchaos_run_diagnoses_a_failed_run(tmp_path):
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run([KVCHAOS, "run", str(REPO / "scenarios" / "smoke.yaml"), "--bug", "hit-plus-one-chunk",
                        "--report-dir", str(tmp_path / "reports"), "--diagnose", "1"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 1, out
    (run_dir,) = [d for d in (tmp_path / "reports").iterdir() if d.name.startswith("smoke-")]
    diag = json.loads((run_dir / "diagnosis.json").read_text())
    assert diag["requests"] and not diag["error"], diag
    assert {r["verdict"] for r in diag["requests"]} == {"prefix_length"}, diag["requests"]  # the planted class
