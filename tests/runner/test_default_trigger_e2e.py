"""Proof by default through `kvchaos run` on a small real stack (Redis behind the fault proxy, a
pinger making traffic on the link; issue 34): a latency fault without a trigger acts on the
pinger's traffic, but no request of the workload crosses the link, so its kind's default
trigger is not reached and the run is inconclusive (exit 4), never passed; the same fault with
`trigger: none` and a reason is "passed (window not proven)", exit 5."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.slow

SCENARIO = """\
name: default-trigger
description: a latency toxic on a link only the pinger uses; the phase sends no request
stack: proxy-redis.yml
seed: 1
phases:
  - name: hold
    requests: 0
    faults:
      - {kind: latency, name: slow-link, link: cache-link, latency_ms: 50, duration: 1500ms}
checks:
  evidence: {}
"""


def run(tmp_path: Path, text: str) -> tuple[int, dict, Path, str]:
    tmp_path.mkdir()
    shutil.copy(DATA / "proxy-redis.yml", tmp_path / "proxy-redis.yml")
    (tmp_path / "default-trigger.yaml").write_text(text)
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "run", str(tmp_path / "default-trigger.yaml"),
                        "--report-dir", str(tmp_path / "reports")], env=env, capture_output=True, text=True,
                       timeout=240)
    (result,) = list((tmp_path / "reports").glob("default-trigger-*/result.json"))
    return r.returncode, json.loads(result.read_text()), result.parent, r.stdout + r.stderr


def test_no_trigger_and_no_request_is_inconclusive_and_trigger_none_is_unproven(tmp_path):
    code, result, _, out = run(tmp_path / "a", SCENARIO)
    (ev,) = [c for c in result["checks"] if c["name"] == "evidence"]
    assert code == 4, out
    assert result["verdict"] == "unknown"
    assert ev["summary"].startswith("inconclusive: faults acted: 1 of 1; triggers reached: 0 of 1 (1 the kind's "
                                    "default); latency slow-link (phase hold): trigger (default for latency) not "
                                    "reached: a request of the workload was in flight"), ev["summary"]
    (row,) = ev["details"]["faults"]
    assert row["acted"] is True and row["default_trigger"]["basis"] == "requests_in_place"

    unproven = SCENARIO.replace("duration: 1500ms}", "duration: 1500ms, trigger: none,\n"
                                "         reason: the pinger stands in for a client here}")
    code, result, run_dir, out = run(tmp_path / "b", unproven)
    (ev,) = [c for c in result["checks"] if c["name"] == "evidence"]
    assert code == 5, out
    assert result["verdict"] == "passed (window not proven)" and result["exit_code"] == 5
    assert ev["details"]["unproven"] == ["latency slow-link (phase hold): trigger: none (the pinger stands in for "
                                         "a client here)"]
    assert "default-trigger: passed (window not proven): faults acted: 1 of 1" in out
    case = [c for c in ET.parse(run_dir / "junit.xml").getroot().iter("testcase") if c.get("name") == "evidence"][0]
    assert case.find("skipped").get("type") == "window-not-proven"
    assert 'id="verdict">passed (window not proven)<' in (run_dir / "report.html").read_text()
