"""The vLLM stack's planted bugs (chaos/vllm/bugs.py) in the vLLM venv: every wrapper lands on
LMCache's own connector classes, the stack hands the bug to the engine and never to the twin,
and on the real stack each bug is caught by the scenario meant for it while the clean engine
passes it (`kvchaos zoo --stack compose/vllm-cpu.yml`: one stack, an engine restart per bug;
about 20 minutes on 2 cores), and `kvchaos diagnose` names each caught bug's class
(chaos.vllm.bugs.DIAGNOSIS)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from chaos.stack.spec import load_stack
from chaos.vllm import bugs
from chaos.vllm.cli import vllm_python

REPO = Path(__file__).resolve().parents[2]
PATCH_ALL = ("import chaos.vllm.launch; from chaos.vllm import bugs; bugs.install(sorted(bugs.BUGS)); "
             "print(' '.join(bugs.patched()))")
STACK = REPO / "compose" / "vllm-cpu.yml"


def test_every_bug_patches_lmcaches_own_connector_in_the_vllm_venv():
    r = subprocess.run([str(vllm_python()), "-c", PATCH_ALL], capture_output=True, text=True, timeout=300,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == sorted(bugs.BUGS)
    for name in bugs.BUGS:  # each process that patches says so in the engine's log
        assert f"kvchaos planted bug {name}: patched" in r.stderr


def test_the_stack_hands_planted_bugs_to_the_engine_only(tmp_path):
    spec = load_stack(STACK, environ={**os.environ, "KVCHAOS_ENGINE_BUGS": "drop-cache-salt"},
                      run_dir=tmp_path, require_commands=False, allocate_ports=False)
    assert spec.settings.planted_bugs == "vllm" and "engine.planted_bugs" in spec.settings.capabilities
    assert spec.services["engine"].env()["KVCHAOS_VLLM_BUGS"] == "drop-cache-salt"
    assert spec.services["engine-recompute"].env()["KVCHAOS_VLLM_BUGS"] == ""


def test_zoo_on_the_real_vllm_catches_every_planted_bug(tmp_path):
    out = tmp_path / "zoo"
    r = subprocess.run([str(REPO / ".venv/bin/kvchaos"), "zoo", "--stack", str(STACK), "--out", str(out),
                        "--report-dir", str(tmp_path / "runs")], capture_output=True, text=True,
                       timeout=3600, cwd=REPO,
                       # a vLLM replay takes seconds on 2 busy cores: room for 3 requests' diagnoses
                       env={**os.environ, "KVCHAOS_DIAGNOSE_BUDGET_S": "180"})
    matrix = json.loads((out / "matrix.json").read_text())
    cells = matrix["cells"]
    assert all(c == "passed" for c in cells["clean"].values() if c != "-"), cells["clean"]
    for bug, scenarios in bugs.ZOO_MAP.items():
        assert any(cells[bug][s] == "caught" for s in scenarios), (bug, cells[bug], r.stderr[-2000:])
    # `kvchaos diagnose` (run on each failed run) names each bug's class, never a wrong one
    diagnoses = matrix.get("diagnoses") or {}
    for bug, verdict in bugs.DIAGNOSIS.items():
        got = [diagnoses.get(bug, {}).get(s) for s in bugs.ZOO_MAP[bug] if cells[bug][s] == "caught"]
        if verdict is None:  # leaks only: nothing to diagnose
            assert got and all(g is None for g in got), (bug, got)
        else:  # every diagnosed request gets the class or an honest "unknown", at least one the class
            classes = [set(re.findall(r"\b(kv_content|kv_after_load|prefix_length|key_identity|logits_sampling|"
                                      r"engine_side|unknown)\b", g or "")) for g in got]
            assert got and all(c and c <= {verdict, "unknown"} and verdict in c for c in classes), (bug, got)
    assert r.returncode == 0, r.stderr[-3000:]
