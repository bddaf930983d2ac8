"""`kvchaos run --backend compose` end to end on the reference stack in Docker.

- a node-exit scenario passes with the LMCache container killed and restarted by the fault,
  and gives the same verdict as under the local backend;
- after a passing run, a failing run and a run interrupted with SIGINT, no container, network
  or volume of kvchaos is left.

Needs the image kvchaos/reference:latest (scripts/build-image.sh). Under CI (CI=true) a missing
image is an error, not a skip: the compose backend must really be tested there.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos.history import load_history
from chaos.stack.compose import image_exists
from kvchaos_support import communicate_or_dump, default_sigint

REPO = Path(__file__).resolve().parents[2]
IMAGE = "kvchaos/reference:latest"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def image(docker):
    if not image_exists(docker, IMAGE):
        msg = f"image {IMAGE} is not present: build it with scripts/build-image.sh"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return IMAGE


def own_projects(root: Path) -> set[str]:
    """The compose projects the runs under ``root`` started: each ``docker-compose -p PROJECT``
    command is written to the stack's compose.log once it ran. Only these are this test's
    business: on a shared host another kvchaos (a second CI job, a developer's run) may have
    projects of its own up, and they are not leftovers of this run."""
    found: set[str] = set()
    for log in root.rglob("compose.log"):
        found |= set(re.findall(r" -p (kvchaos-[a-z0-9_-]+) ", log.read_text(errors="replace")))
    return found


def kvchaos_containers(leftovers, root: Path) -> list[str]:
    """Containers, networks and volumes left of the compose projects the runs under ``root``
    started; a run that started none fails the test (nothing to check is no pass)."""
    projects = own_projects(root)
    assert projects, f"no compose project in the compose logs under {root}"
    return [name for p in sorted(projects) for names in leftovers(p).values() for name in names]


def run(args: list[str], tmp_path: Path, env_extra: dict[str, str] | None = None,
        timeout: float = 600) -> tuple[int, dict]:
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / "state"), **(env_extra or {}))
    reports = tmp_path / "reports"
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "run", *args, "--report-dir", str(reports)],
                       env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    results = {}
    for res in reports.glob("*/result.json"):
        data = json.loads(res.read_text())
        results[data["scenario"]] = data
    return r.returncode, {"results": results, "out": r.stdout + r.stderr}


def test_node_exit_under_compose_matches_local(image, leftovers, tmp_path):
    code, got = run(["scenarios/node-exit-lmcache.yaml", "--backend", "compose"], tmp_path / "compose")
    result = got["results"]["node-exit-lmcache"]
    assert code == 0, got["out"][-4000:]
    kill = [f for f in result["faults"] if f["kind"] == "kill"]
    assert kill and kill[0]["bit"] is True and kill[0]["params"]["service"] == "lmcache"
    assert result["service_exits"] and all(e["killed_by_fault"] for e in result["service_exits"])
    assert kvchaos_containers(leftovers, tmp_path / "compose") == []
    # The window: requests keep coming after the kill is in place. With 9 outage requests, under
    # load the docker kill landed after all of them were done (1.4 s into the phase) and the run
    # was inconclusive; with 27, 15 were sent while the kill was being applied (due at 200 ms,
    # begun 1.15 s in, 1.8 s to apply) and only 5 after it (2026-12-03, `make test` under 4 busy
    # loops). `hold_requests` holds those not yet sent until the kill is in place.
    (history,) = (tmp_path / "compose" / "reports").glob("node-exit-lmcache-*/history.jsonl")
    ops = load_history(history)
    killed_at = next(o.time for o in ops if o.f == "apply" and o.type == "ok")
    after = [o for o in ops if o.f == "complete" and o.type == "invoke" and o.phase == "outage" and o.time > killed_at]
    applying = next(o.time for o in ops if o.f == "apply" and o.type == "invoke")
    assert not [o for o in ops if o.f == "complete" and o.type == "invoke" and applying < o.time < killed_at]
    assert len(after) >= 9, (killed_at, len(after))

    local_code, local = run(["scenarios/node-exit-lmcache.yaml", "--backend", "local"], tmp_path / "local")
    assert local_code == code, local["out"][-4000:]
    assert local["results"]["node-exit-lmcache"]["verdict"] == result["verdict"]


def test_failing_run_leaves_nothing(image, leftovers, tmp_path):
    code, got = run(["scenarios/smoke.yaml", "--backend", "compose", "--bug", "hit-plus-one-chunk"], tmp_path)
    assert code == 1, got["out"][-4000:]
    assert got["results"]["smoke"]["verdict"] == "failed"
    assert kvchaos_containers(leftovers, tmp_path) == []


def test_sigint_mid_run_leaves_nothing(image, docker, leftovers, tmp_path):
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.Popen([sys.executable, "-m", "chaos.cli", "run", "scenarios/node-exit-lmcache.yaml",
                             "--backend", "compose", "--report-dir", str(tmp_path / "reports")],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any(
                c.status == "running" and c.labels.get("com.docker.compose.service") == "engine"
                for c in docker.containers.list(filters={"label": "com.docker.compose.project"})):
            time.sleep(1)
        # The scenario is running once its history has a record (an event, not a guess).
        while time.monotonic() < deadline and not any(
                h.stat().st_size for h in (tmp_path / "reports").glob("node-exit-lmcache*/history.jsonl")):
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out = communicate_or_dump(proc, 300, env["KVCHAOS_STATE_DIR"])
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode not in (0, 1), out[-3000:]
    assert kvchaos_containers(leftovers, tmp_path) == [], out[-3000:]
