"""`kvchaos run --backend compose` end to end on the reference stack in Docker.

- a node-exit scenario passes with the LMCache container killed and restarted by the fault,
  and gives the same verdict as under the local backend; it runs after a failing scenario with
  a planted engine bug in the same compose run (one stack start for both claims): the suite's
  engine restart between them gives it the clean engine;
- after a passing run, a failing run and a run interrupted with SIGINT (at three moments), no
  container, network or volume of kvchaos is left, nothing is mounted under the run's folders
  (the filesystem L2's tmpfs) and no journal entry is left open.

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
import yaml

from chaos.history import load_history
from chaos.stack.compose import image_exists
from kvchaos_support import communicate_or_dump, default_sigint, mounts_under, open_journal_entries

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


def left_behind(leftovers, root: Path) -> dict[str, list[str]]:
    """What the runs under ``root`` (state in ``root/state``) left: containers, networks and
    volumes of their compose projects, mounts under ``root`` (the filesystem L2's tmpfs), open
    journal entries. When anything is left it is then undone (``kvchaos cleanup``, and a lazy
    unmount of what that left mounted), so a failing test leaves no busy mount in pytest's
    basetemp; the returned lists say what was found before that."""
    found = {"containers": kvchaos_containers(leftovers, root), "mounts": mounts_under(root),
             "journal": open_journal_entries(root / "state")}
    if any(found.values()):
        subprocess.run([sys.executable, "-m", "chaos.cli", "cleanup"], capture_output=True, timeout=300,
                       env=dict(os.environ, KVCHAOS_STATE_DIR=str(root / "state")), cwd=REPO)
        for point in reversed(mounts_under(root)):
            subprocess.run(["umount", "-l", point], capture_output=True)
    return found


NOTHING = {"containers": [], "mounts": [], "journal": []}


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


def _smoke_with_planted_bug(folder: Path) -> Path:
    """scenarios/smoke.yaml with the engine's planted bug hit-plus-one-chunk (``engine.bugs``,
    what ``--bug`` sets for every scenario of a run): it must fail recompute_equivalence."""
    doc = yaml.safe_load((REPO / "scenarios" / "smoke.yaml").read_text())
    doc["stack"] = str(REPO / "compose" / "reference.yml")
    doc["engine"] = {**doc.get("engine", {}), "bugs": ["hit-plus-one-chunk"]}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "smoke.yaml"  # named as the scenario
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def compose_run(image, tmp_path_factory) -> tuple[Path, int, dict]:
    """One `kvchaos run --backend compose` of two scenarios on one stack (one stack start for
    both claims, issue 32): smoke with a planted bug (fails), then node-exit-lmcache (the
    suite restarts the engine without the bug between them; node-exit then kills LMCache).
    Returns the run's folder, its exit code and its results."""
    root = tmp_path_factory.mktemp("compose-run")
    smoke = _smoke_with_planted_bug(root / "scenarios")
    code, got = run([str(smoke), "scenarios/node-exit-lmcache.yaml", "--backend", "compose"], root)
    return root, code, got


def test_node_exit_under_compose_matches_local(compose_run, leftovers, tmp_path):
    root, _code, got = compose_run
    result = got["results"]["node-exit-lmcache"]
    assert result["verdict"] == "passed", got["out"][-4000:]
    assert result["engine_bugs"] == []  # the engine the smoke before it ran with a bug was replaced
    kill = [f for f in result["faults"] if f["kind"] == "kill"]
    assert kill and kill[0]["bit"] is True and kill[0]["params"]["service"] == "lmcache"
    assert result["service_exits"] and all(e["killed_by_fault"] for e in result["service_exits"])
    assert left_behind(leftovers, root) == NOTHING
    # The window: requests keep coming after the kill is in place. With 9 outage requests, under
    # load the docker kill landed after all of them were done (1.4 s into the phase) and the run
    # was inconclusive; with 27, 15 were sent while the kill was being applied (due at 200 ms,
    # begun 1.15 s in, 1.8 s to apply) and only 5 after it (2026-12-03, `make test` under 4 busy
    # loops). `hold_requests` holds those not yet sent until the kill is in place.
    (history,) = (root / "reports").glob("node-exit-lmcache-*/history.jsonl")
    ops = load_history(history)
    killed_at = next(o.time for o in ops if o.f == "apply" and o.type == "ok")
    after = [o for o in ops if o.f == "complete" and o.type == "invoke" and o.phase == "outage" and o.time > killed_at]
    applying = next(o.time for o in ops if o.f == "apply" and o.type == "invoke")
    assert not [o for o in ops if o.f == "complete" and o.type == "invoke" and applying < o.time < killed_at]
    assert len(after) >= 9, (killed_at, len(after))

    local_code, local = run(["scenarios/node-exit-lmcache.yaml", "--backend", "local"], tmp_path / "local")
    assert local_code == 0, local["out"][-4000:]  # 0: every check passed, as under compose
    assert local["results"]["node-exit-lmcache"]["verdict"] == result["verdict"]
    assert (mounts_under(tmp_path / "local"), open_journal_entries(tmp_path / "local" / "state")) == ([], [])


def test_failing_run_leaves_nothing(compose_run, leftovers):
    """A run whose scenario fails (exit 1; its other scenario, node-exit-lmcache, passes: the
    test above) leaves no container, network, volume, mount or open journal entry."""
    root, code, got = compose_run
    assert code == 1, got["out"][-4000:]
    assert got["results"]["smoke"]["verdict"] == "failed"
    assert got["results"]["smoke"]["engine_bugs"] == ["hit-plus-one-chunk"]
    assert left_behind(leftovers, root) == NOTHING, got["out"][-3000:]


def _engine_running(docker, root: Path) -> bool:
    """The engine container of a compose project started under ``root`` runs (another run's
    engine on a shared host does not count)."""
    projects = own_projects(root)
    return any(c.status == "running" and c.labels.get("com.docker.compose.service") == "engine"
               and c.labels.get("com.docker.compose.project") in projects
               for c in docker.containers.list(filters={"label": "com.docker.compose.project"}))


def _history_ops(root: Path) -> list[dict]:
    """The records of the run's history so far (a torn last line left out)."""
    ops = []
    for h in (root / "reports").glob("node-exit-lmcache*/history.jsonl"):
        for line in h.read_text(errors="replace").splitlines():
            try:
                ops.append(json.loads(line))
            except ValueError:
                pass
    return ops


#: When the SIGINT is sent, each an event of the run (not a guess at a delay): the filesystem
#: L2's tmpfs is mounted (no container yet); the engine's container runs (the stack is still
#: starting: the LMCache and proxy containers wait on it); the history's first record (the
#: scenario runs); the kill of LMCache in place (its restart is due 3 s later, from a timer thread).
MOMENTS = {
    "l2-mounted": lambda _docker, root: bool(mounts_under(root)),
    "engine-running": _engine_running,
    "first-record": lambda _docker, root: bool(_history_ops(root)),
    "lmcache-killed": lambda _docker, root: any(o.get("f") == "apply" and o.get("type") == "ok"
                                                for o in _history_ops(root)),
}


#: Two moments in `make test` (before any container; mid-scenario), the other two, repetitions
#: of the same claim at about 60 s of a compose run each, in `make nightly` (issue "Fast feedback").
_NIGHTLY_MOMENTS = {"engine-running", "lmcache-killed"}


@pytest.mark.parametrize("moment", [pytest.param(m, marks=pytest.mark.nightly) if m in _NIGHTLY_MOMENTS else m
                                    for m in MOMENTS])
def test_sigint_mid_run_leaves_nothing(image, docker, leftovers, tmp_path, moment):
    """SIGINT at any point of a compose run: no container, no mount under the run's folders (the
    filesystem L2's tmpfs), no journal entry left open. Input: CI found the l2fs tmpfs of this
    test's run still mounted hours later (pytest could not remove its basetemp: EBUSY)."""
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.Popen([sys.executable, "-m", "chaos.cli", "run", "scenarios/node-exit-lmcache.yaml",
                             "--backend", "compose", "--report-dir", str(tmp_path / "reports")],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 300
        reached = MOMENTS[moment]
        while time.monotonic() < deadline and proc.poll() is None and not reached(docker, tmp_path):
            time.sleep(0.1)
        assert proc.poll() is None, f"the run ended before {moment}"
        assert reached(docker, tmp_path), f"no {moment} within 300 s"
        proc.send_signal(signal.SIGINT)
        out = communicate_or_dump(proc, 300, env["KVCHAOS_STATE_DIR"])
    finally:
        if proc.poll() is None:
            proc.kill()
    left = left_behind(leftovers, tmp_path)
    assert proc.returncode not in (0, 1), out[-3000:]
    assert left == NOTHING, out[-3000:]
