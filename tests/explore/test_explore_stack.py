"""``kvchaos explore`` end to end on the reference stack with a planted engine bug: with
``--jobs 2`` two generated runs go side by side, the first is caught, diagnosed, shrunk and
signed; the finding's file validates, names the bug and passes on the clean engine;
summary.json and index.html are written. SIGTERM mid-run (serial) leaves an interrupted report,
the summary and no stack process. Marked slow (three stacks, then one).

Seed 55's first scenario (the SIGTERM test) and seed 234's first two (the --jobs test) are
light ones (one cancel fault each, prefixes around chunk boundaries: LMCache hits that
hit-plus-one-chunk turns into wrong outputs); a change of the generator that makes them heavy
shows here as a slow test, not as a wrong verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.scenario.loader import check_scenario

REPO = Path(__file__).resolve().parents[2]


def _services_left(folder: Path) -> list[dict]:
    """Processes whose KVCHAOS_RUN_DIR (every stack service has one) is under ``folder``."""
    import psutil

    left = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if str(folder) in p.environ().get("KVCHAOS_RUN_DIR", ""):
                left.append(p.info)
        except psutil.Error:
            continue
    return left


@pytest.mark.slow
def test_explore_jobs_2_finds_a_planted_bug_side_by_side_and_writes_a_shrunk_finding(tmp_path: Path) -> None:
    """``--jobs 2``: the first two generated scenarios run at once in two campaign workers, each
    on a stack of its own (their runs overlap in time); each result comes back here, where the
    failed ones are diagnosed (in their workers), shrunk, controlled on this process's stack and
    signed. The serial loop's finding path is the same code (``_Explorer.take``); the serial
    loop itself runs in `make explore-smoke` and in the SIGTERM test below."""
    from datetime import datetime

    out = tmp_path / "explore"
    done = subprocess.run(
        [sys.executable, "-m", "chaos.entry", "explore", "--stack", "compose/reference.yml", "--seed", "234",
         "--max-runs", "2", "--jobs", "2", "--budget", "10m", "--bug", "hit-plus-one-chunk", "--shrink-budget", "1s",
         "--shrink-reruns", "1", "--diagnose", "1", "--diagnose-budget", "120", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]  # 1: a new signature
    (folder,) = out.iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["jobs"] == 2 and summary["run_count"] == 2 and summary["stopped_by"] == "max-runs 2", summary
    assert summary["generator_invalid"] == [] and summary["error"] == 0
    assert [r["index"] for r in summary["runs"]] == [0, 1]
    assert [r["outcome"] for r in summary["runs"]] == ["failed", "failed"], summary["runs"]
    spans = []
    for row in summary["runs"]:
        assert Path(row["run_dir"]).parent == folder / "runs", row["run_dir"]
        run = json.loads((Path(row["run_dir"]) / "result.json").read_text())
        assert (Path(row["run_dir"]) / "explore-run.json").is_file()
        start = datetime.fromisoformat(run["started_at"]).timestamp()
        spans.append((start, start + run["durations"]["total_s"]))
    (a0, a1), (b0, b1) = spans
    assert a0 < b1 and b0 < a1, spans  # side by side, not one after the other
    # both runs fail the same way (one cancel each): one signature, the second run "seen before"
    (sig,) = summary["signatures"]
    assert sig["count"] == 2 and sorted(sig["runs"]) == sorted(r["run_dir"] for r in summary["runs"]), sig
    # the control shows the failure needs the bug: the signature drops the cancel the shrink kept
    assert sig["checks"] == ["recompute_equivalence"] and sig["faults"] == [], sig
    assert sig["diagnosis"] == "prefix_length", sig
    assert sig["reproducer_faults"] == ["cancel"] and sig["faults_irrelevant"] == "control", sig
    assert sig["known"] is None
    assert sig["shrink"]["done"] and sig["shrink"]["verified"] == 1, sig["shrink"]
    # the control run of the finding on the clean engine passes: the failure is the bug's
    assert sig["clean_engine_failed_checks"] == [] and sig["attributed_to_bug"] is True, sig
    check = check_scenario(sig["scenario"], require_commands=True)
    assert check.ok, check.error()
    assert check.scenario.engine.bugs == ["hit-plus-one-chunk"]
    page = (folder / "index.html").read_text()
    assert sig["signature"] in page and "report.html" in page
    assert all((Path(r["run_dir"]) / "report.html").is_file() for r in summary["runs"])
    assert _services_left(folder) == []  # no service of any worker's stack, nor of the control's


@pytest.mark.slow
def test_sigterm_mid_run_heals_stops_and_still_writes_the_summary(tmp_path: Path) -> None:
    """SIGTERM while the first run's phases go on: exit 143, the run reported ``interrupted``,
    summary.json and index.html written, no process of the stack left (a service's
    KVCHAOS_RUN_DIR is a folder under the exploration's). Guided (``--guide``, the first of
    the candidates, all untried, is scenario 0 as without it): the engine measured itself."""
    import signal
    import time

    out = tmp_path / "explore"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.entry", "explore", "--stack", "compose/reference.yml", "--seed", "55",
         "--max-runs", "2", "--budget", "6m", "--guide", "--out", str(out)],
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
    assert _services_left(folder) == []  # no service of the stack
    # --guide --jobs 1 on the reference stack: its engine measured its branches for the guide
    assert list((folder / "engine-coverage").glob(".coverage.*")), "the engine saved no coverage data"

