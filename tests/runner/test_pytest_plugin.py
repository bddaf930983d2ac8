"""The pytest plugin: scenarios as items, deselected unless `-m chaos`, short failures, JUnit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.slow


@pytest.fixture
def project(tmp_path):
    """A folder with two scenarios (one passes, one is inconclusive) and their stacks."""
    scen = tmp_path / "scenarios"
    scen.mkdir()
    for name in ("hold-latency.yaml", "idle-link.yaml", "proxy-redis.yml", "proxy-redis-idle.yml"):
        shutil.copy(DATA / name, scen / name)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = scenarios\n")
    return tmp_path


def pytest_in(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(project / "state"))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=project,
                          env=env, capture_output=True, text=True, timeout=300)


def test_plain_pytest_starts_no_stack(project):
    r = pytest_in(project, "-q")
    assert "2 deselected" in r.stdout, r.stdout
    assert not (project / "reports").exists()


def test_chaos_marker_runs_scenarios_with_short_failures_and_junit(project):
    r = pytest_in(project, "-m", "chaos", "--junitxml", "junit.xml", "-rA")
    out = r.stdout
    assert r.returncode == 1, out
    assert "1 failed, 1 passed" in out
    # The inconclusive scenario fails with the check's one-line explanation, not a traceback.
    assert "evidence unknown: inconclusive: faults acted: 0 of 1" in out
    assert "Traceback" not in out
    assert "kvchaos scenario times" in out
    suite = ET.parse(project / "junit.xml").getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {"hold-latency", "idle-link"}
    assert cases["idle-link"].find("failure") is not None
    assert cases["hold-latency"].find("failure") is None
    report = [p for p in cases["hold-latency"].iter("property") if p.get("name") == "report"]
    assert report and Path(report[0].get("value")).name == "report.html"


def test_a_scenario_the_other_stack_cannot_run_is_skipped_naming_the_need(tmp_path):
    """--kvchaos-stack: a scenario valid on its own stack that needs what the other stack lacks
    is skipped with the missing capability (the rest of the catalogue still runs there)."""
    scen = tmp_path / "scenarios"
    scen.mkdir()
    stack = (DATA / "proxy-redis-idle.yml").read_text()
    (scen / "own.yml").write_text(stack.replace("x-kvchaos:\n", "x-kvchaos:\n  capabilities: [engine.hooks.stall]\n", 1))
    (scen / "other.yml").write_text(stack)
    (scen / "needs-stall.yaml").write_text(
        "name: needs-stall\nstack: own.yml\nphases:\n  - name: hold\n    requests: 0\n    faults:\n"
        "      - {kind: hook, name: stall, service: redis, needs: [engine.hooks.stall], apply: {argv: ['true']},"
        " evidence: {argv: ['true']}, duration: 1s}\nchecks:\n  evidence: {}\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = scenarios\n")
    r = pytest_in(tmp_path, "-m", "chaos", "-rs", "--kvchaos-stack", str(scen / "other.yml"))
    assert "1 skipped" in r.stdout, r.stdout + r.stderr
    assert "lacks what it needs: engine.hooks.stall (fault 'stall' (hook))" in r.stdout


def test_chaos_items_run_in_kvchaos_run_order() -> None:
    """pytest sorted `scenarios/findings/` in by name, between disk-full and l2-delete; a stack
    then sat idle 8 minutes between two scenarios that share it (l1-full-drops-l2-stores and
    working-set-exceeds-l1) and LMCache reaped the engine's registration (CI, 2026-12-01).
    `pytest -m chaos` now runs the catalogue in `kvchaos run`'s order."""
    import subprocess
    import sys
    from pathlib import Path

    from chaos.scenario.loader import discover_scenarios

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "chaos",
                          "--collect-only", "-q", "scenarios"], cwd=repo, capture_output=True, text=True,
                         timeout=120).stdout
    got = [line.split("::")[0] for line in out.splitlines() if "::" in line]
    want = [str(p.relative_to(repo)) for p in discover_scenarios(repo / "scenarios")]
    assert got == want


def test_a_heal_that_fails_could_not_run_and_is_never_an_expected_failure(tmp_path):
    """A fault whose heal raised leaves a stack that is not the scenario's: the item fails as
    "could not run" (an infrastructure error), never XFAIL, skipped or passed, whatever the checks
    would have said."""
    scen = tmp_path / "scenarios"
    scen.mkdir()
    shutil.copy(DATA / "proxy-redis-idle.yml", scen / "proxy-redis-idle.yml")
    (scen / "bad-heal.yaml").write_text(
        "name: bad-heal\nstack: proxy-redis-idle.yml\nxfail: {reason: a known bug}\nphases:\n  - name: hold\n"
        "    requests: 0\n    faults:\n      - {kind: hook, name: bad-heal, service: redis, apply: {argv: ['true']},"
        " heal: {argv: ['false']}, evidence: {argv: ['true']}, duration: 1s}\n  - name: later\n    requests: 0\n"
        "checks:\n  evidence: {}\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = scenarios\n")
    r = pytest_in(tmp_path, "-m", "chaos", "-rA")
    assert "1 failed" in r.stdout, r.stdout + r.stderr
    assert "could not run: heal of fault bad-heal (hook) failed: RuntimeError: hook heal:" in r.stdout, r.stdout


def test_nightly_shards_partition_the_catalogue(tmp_path):
    """`make nightly-shard SHARD=k SHARDS=n` (the nightly workflow's matrix): pytest-split's
    groups of the scenario items are disjoint and together the whole catalogue, and the
    recorded times (.test_durations) balance them: a scenario recorded as longer than all the
    others together is a group of its own."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]

    def group(k: int, durations: Path) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "chaos",
                              "--splits", "3", "--group", str(k), "--durations-path", str(durations),
                              "--splitting-algorithm", "least_duration",
                              "--collect-only", "scenarios"], cwd=repo, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        return [ln for ln in out.stdout.splitlines() if ln.startswith("scenarios/") and "::" in ln]

    every = sorted(str(p.relative_to(repo)) for p in (repo / "scenarios").rglob("*.yaml"))
    durations = tmp_path / "durations.json"
    long = "scenarios/smoke.yaml::smoke"
    durations.write_text(json.dumps({**{f"{f}::{Path(f).stem}": 1.0 for f in every}, long: 10_000.0}))
    groups = [group(k, durations) for k in (1, 2, 3)]
    ids = [i for g in groups for i in g]
    assert len(ids) == len(set(ids)) and sorted(i.split("::")[0] for i in ids) == every, groups
    assert [long] in groups, groups  # alone: it weighs more than the rest together
