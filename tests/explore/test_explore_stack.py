"""``kvchaos explore`` end to end on the reference stack with a planted engine bug: one
generated run is caught, diagnosed, shrunk and signed; the finding's file validates, names the
bug and passes on the clean engine; summary.json and index.html are written. SIGTERM mid-run
leaves an interrupted report, the summary and no stack process. Marked slow (one stack each,
a few runs: about 2.5 minutes for both on the 2-core host).

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
    # the control shows the failure needs the bug: the signature drops the cancel the shrink kept
    assert sig["checks"] == ["recompute_equivalence"] and sig["faults"] == [], sig
    assert sig["reproducer_faults"] == ["cancel"] and sig["faults_irrelevant"] == "control", sig
    assert sig["count"] == 1 and sig["first_run_index"] == 0 and sig["known"] is None
    assert sig["shrink"]["done"] and sig["shrink"]["verified"] == 1, sig["shrink"]
    # the control run of the finding on the clean engine passes: the failure is the bug's
    assert sig["clean_engine_failed_checks"] == [] and sig["attributed_to_bug"] is True, sig
    check = check_scenario(sig["scenario"], require_commands=True)
    assert check.ok, check.error()
    assert check.scenario.engine.bugs == ["hit-plus-one-chunk"]
    page = (folder / "index.html").read_text()
    assert sig["signature"] in page and "report.html" in page
    assert (Path(summary["runs"][0]["run_dir"]) / "report.html").is_file()


@pytest.mark.slow
def test_sigterm_mid_run_heals_stops_and_still_writes_the_summary(tmp_path: Path) -> None:
    """SIGTERM while the first run's phases go on: exit 143, the run reported ``interrupted``,
    summary.json and index.html written, no process of the stack left (a service's
    KVCHAOS_RUN_DIR is a folder under the exploration's)."""
    import signal
    import time

    out = tmp_path / "explore"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.entry", "explore", "--stack", "compose/reference.yml", "--seed", "55",
         "--max-runs", "2", "--budget", "6m", "--out", str(out)],
        cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    seen = []
    deadline = time.monotonic() + 300
    assert proc.stderr is not None
    for line in proc.stderr:  # the first run's phases have begun: its stack is up
        seen.append(line)
        if "phase warm" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, "".join(seen) + rest
    (folder,) = out.iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["stopped_by"].startswith("interrupted") and "SIGTERM" in summary["stopped_by"]
    assert [r["outcome"] for r in summary["runs"]] == ["interrupted"]
    assert (folder / "index.html").is_file()
    run = json.loads((Path(summary["runs"][0]["run_dir"]) / "result.json").read_text())
    assert run["verdict"] == "interrupted"
    import psutil

    left = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if str(folder) in p.environ().get("KVCHAOS_RUN_DIR", ""):
                left.append(p.info)
        except psutil.Error:
            continue
    assert left == [], left  # no service of the stack (KVCHAOS_RUN_DIR under the exploration's folder)
