"""``kvchaos explore`` end to end on the reference stack with a planted engine bug: one
generated run is caught, diagnosed, shrunk and signed; the finding's file validates and names
the bug; summary.json and index.html are written. Marked slow (one stack, about 3 runs: 2-3
minutes on the 2-core host).

Seed 55's first scenario is a light one (one cancel fault, 6 requests, prefixes of 255-698
tokens: LMCache hits that hit-plus-one-chunk turns into wrong outputs); a change of the generator
that makes it heavy shows here as a slow test, not as a wrong verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.scenario.loader import check_scenario

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_explore_finds_a_planted_bug_and_writes_a_shrunk_finding(tmp_path: Path) -> None:
    out = tmp_path / "explore"
    done = subprocess.run(
        [sys.executable, "-m", "chaos.entry", "explore", "--stack", "compose/reference.yml", "--seed", "55",
         "--max-runs", "1", "--budget", "6m", "--bug", "hit-plus-one-chunk", "--shrink-budget", "1s",
         "--shrink-reruns", "1", "--diagnose", "1", "--diagnose-budget", "30", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]  # 1: a new signature
    (folder,) = out.iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["run_count"] == 1 and summary["failed"] == 1 and summary["generator_invalid"] == []
    (sig,) = summary["signatures"]
    assert "recompute_equivalence" in sig["checks"] and sig["faults"] == ["cancel"]
    assert sig["count"] == 1 and sig["first_run_index"] == 0 and sig["known"] is None
    assert sig["shrink"]["done"] and sig["shrink"]["verified"] == 1, sig["shrink"]
    check = check_scenario(sig["scenario"], require_commands=True)
    assert check.ok, check.error()
    assert check.scenario.engine.bugs == ["hit-plus-one-chunk"]
    page = (folder / "index.html").read_text()
    assert sig["signature"] in page and "report.html" in page
    assert (Path(summary["runs"][0]["run_dir"]) / "report.html").is_file()
