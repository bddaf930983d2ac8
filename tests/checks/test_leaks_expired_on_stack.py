"""A lock that LMCache's TTL frees is a leak, not a clean quiesce (issue 34).

With LMCache's L1 read-lock TTL cut to 2 s (LMCACHE_L1_READ_TTL_SECONDS), the planted
`short-free-after-failed-load` (one chunk's lock of a dropped retrieve never freed) passed
`retrieve-dropped-slow-link`: the TTL freed the lock before the quiesce ended, and
`read_locked_count` read 0. The reference stack's LMCache keeps a ledger of its read locks
(chaos/stack/lmcache_locks.py): the same scenario with the same TTL now fails `leaks` on the
locks that expired instead of being freed, and passes with the clean engine. Both runs on one
stack (the engine restarts for the bug): the clean run first, because a run whose ``leaks``
check fails has the suite start the whole stack afresh for the next one
(chaos/runner/stacks.py); marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KVCHAOS = str(Path(sys.executable).with_name("kvchaos"))
BUG = "short-free-after-failed-load"


def _copy(tmp: Path, name: str, bugs: list[str]) -> None:
    doc = yaml.safe_load((REPO / "scenarios" / "retrieve-dropped-slow-link.yaml").read_text())
    doc["name"] = name
    doc["stack"] = str(REPO / "compose" / "reference.yml")
    doc["variables"] = {**doc.get("variables", {}), "LMCACHE_L1_READ_TTL_SECONDS": "2"}
    doc["engine"] = {"bugs": bugs}
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.mark.slow
def test_a_lock_the_ttl_freed_is_a_leak_and_the_clean_engine_passes(tmp_path):
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    _copy(scenarios, "a-ttl2-clean", [])  # a suite runs its scenarios in file-name order
    _copy(scenarios, "b-ttl2-planted", [BUG])
    reports = tmp_path / "reports"
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run([KVCHAOS, "run", str(scenarios), "--report-dir", str(reports), "--diagnose", "0"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    out = r.stdout[-3000:] + r.stderr[-2000:]
    results = {}
    for name in ("a-ttl2-clean", "b-ttl2-planted"):
        [path] = reports.glob(f"{name}-*/result.json")
        results[name] = {c["name"]: c for c in json.loads(path.read_text())["checks"]}
        snaps = json.loads((path.parent / "snapshots.json").read_text())
        lock_samples = [s for s in snaps["leak_samples"] if s["source"] == "lmcache"]
        # the TTL emptied read_locked_count in both runs: only the ledger tells them apart
        assert lock_samples[-1]["values"]["read_locked_count"] == 0, (name, out)
    planted, clean = results["b-ttl2-planted"]["leaks"], results["a-ttl2-clean"]["leaks"]
    assert planted["verdict"] == "failed", (planted["summary"], out)
    assert "expired by a TTL instead of being freed" in planted["summary"]
    assert [x["field"] for x in planted["details"]["expired"]] == ["read_locks_expired"]
    assert clean["verdict"] == "passed", (clean["summary"], out)
    for checks in results.values():
        assert checks["recompute_equivalence"]["verdict"] == "passed"
