"""Findings: every scenario under scenarios/findings/ has its page in docs/findings/ and every
page its scenario; each is an xfail scenario saying where it is reported; each page is written
as an upstream issue (sections) and its root cause names LMCache code that exists in the
installed package; the index lists every page. Also `kvchaos findings`, `kvchaos list` and the
pytest plugin see the findings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.scenario.findings import PAGE_SCENARIO_RE, finding_rows, latest_outcomes, pages_by_scenario
from chaos.scenario.loader import discover_scenarios, load_scenario

REPO = Path(__file__).resolve().parents[2]
FINDINGS = REPO / "scenarios" / "findings"
DOCS = REPO / "docs" / "findings"
SCENARIOS = discover_scenarios(FINDINGS)
PAGES = sorted(p for p in DOCS.glob("*.md") if p.name != "README.md")
SECTIONS = ["## Configuration", "## Reproducer", "## Expected", "## What happened", "## Root cause",
            "## Suggested fix", "## Upstream"]
# LMCache source paths as the pages cite them (relative to the installed package).
_LMCACHE_PATH = re.compile(r"\b((?:v1|integration|cli)/[A-Za-z0-9_/]+\.py)\b")


def test_there_are_findings() -> None:
    assert len(SCENARIOS) >= 4 and len(PAGES) >= 4


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_findings_scenario_has_one_page_and_says_where_it_is_reported(path: Path) -> None:
    s = load_scenario(path)
    assert s.xfail is not None, f"{path.name}: a finding's reproducer is marked xfail"
    assert s.xfail.upstream, f"{path.name}: xfail.upstream names the report (or 'not yet reported')"
    naming = [p.name for p in PAGES if s.name in PAGE_SCENARIO_RE.findall(p.read_text())]
    assert len(naming) == 1, f"{path.name}: named by {naming or 'no page'} in docs/findings/ (want one)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_page_has_a_scenario_and_the_sections_of_an_upstream_issue(page: Path) -> None:
    text = page.read_text()
    names = set(PAGE_SCENARIO_RE.findall(text))
    assert names, f"{page.name} names no scenarios/findings/<name>.yaml"
    missing = names - {p.stem for p in SCENARIOS}
    assert not missing, f"{page.name} names scenarios that do not exist: {sorted(missing)}"
    for section in SECTIONS:
        assert section in text, f"{page.name}: no '{section}' section"
    assert "kvchaos run scenarios/findings/" in text, f"{page.name}: give the exact command"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_root_cause_names_lmcache_code_that_exists(page: Path) -> None:
    lmcache = pytest.importorskip("lmcache")
    root = Path(lmcache.__file__).parent
    cause = page.read_text().split("## Root cause", 1)[1].split("\n## ", 1)[0]
    cited = set(_LMCACHE_PATH.findall(cause))
    native = "csrc/" in cause  # a native (C++) component: cited from upstream source
    assert cited or native, f"{page.name}: the root cause names no LMCache file"
    for rel in cited:
        hits = list(root.rglob(Path(rel).name))
        assert any(h.as_posix().endswith(rel) for h in hits), f"{page.name}: {rel} not in {root}"


VLLM_PAGES = sorted((DOCS / "vllm").glob("*.md"))
# A catalogue scenario as a vLLM page names it (scenarios/<name>.yaml, not under findings/).
_CATALOGUE_SCENARIO = re.compile(r"scenarios/([a-z0-9-]+)\.yaml")


@pytest.mark.parametrize("page", VLLM_PAGES, ids=lambda p: p.stem)
def test_every_vllm_page_names_its_xfail_scenario_and_the_sections_of_an_upstream_issue(page: Path) -> None:
    """A vLLM finding's reproducers are catalogue scenarios whose xfail is scoped to the vLLM
    stack and cites the page, at least one (a bug reached by two routes has one per route:
    fail-policy-kills-engine by load-fail-policy-fail and abort-during-load), each with its exact
    command; its root cause names vLLM code and LMCache code that exists."""
    text = page.read_text()
    for section in SECTIONS:
        assert section in text, f"{page.name}: no '{section}' section"
    names = set(_CATALOGUE_SCENARIO.findall(text))
    scenarios = [REPO / "scenarios" / f"{n}.yaml" for n in names if (REPO / "scenarios" / f"{n}.yaml").exists()]
    assert scenarios, f"{page.name} names no catalogue scenario scenarios/<name>.yaml"
    rel = page.relative_to(REPO).as_posix()
    citing = [p for p in scenarios if (x := load_scenario(p).xfail) is not None and rel in x.reason]
    assert citing, f"{page.name}: cited by the xfail reason of no scenario it names"
    for path in citing:
        xfail = load_scenario(path).xfail
        assert xfail.stacks and "vllm-cpu" in xfail.stacks and xfail.upstream, xfail
        assert f"--stack compose/vllm-cpu.yml {path.relative_to(REPO).as_posix()}" in text, \
            f"{page.name}: give the exact command for {path.name}"
    cause = text.split("## Root cause", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"vllm/v1/[A-Za-z0-9_/]+\.py", cause), f"{page.name}: the root cause names no vLLM file"
    lmcache = pytest.importorskip("lmcache")
    root = Path(lmcache.__file__).parent
    lmcache_cause = re.sub(r"vllm/v1/[A-Za-z0-9_/]+\.py", "", cause)  # vLLM's own v1/ paths
    cited = set(_LMCACHE_PATH.findall(lmcache_cause))
    assert cited, f"{page.name}: the root cause names no LMCache file"
    for rel in cited:
        assert (root / rel).exists(), f"{page.name}: {rel} not in {root}"


def test_index_lists_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    for page in PAGES:
        assert f"({page.name})" in index, f"docs/findings/README.md does not link {page.name}"
    for page in VLLM_PAGES:
        assert f"(vllm/{page.name})" in index, f"docs/findings/README.md does not link vllm/{page.name}"


def test_pages_by_scenario_maps_each_reproducer() -> None:
    pages = pages_by_scenario(DOCS)
    assert {p.stem for p in SCENARIOS} <= set(pages)


def _result(tmp: Path, name: str, started: str, outcome: str | None, bugs: list[str] | None = None) -> None:
    d = tmp / f"{name}-{started}"
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({
        "run_id": d.name, "scenario": name, "verdict": "failed" if outcome == "xfailed" else "passed",
        "exit_code": 0, "started_at": started, "engine_bugs": bugs or [],
        "xfail": {"reason": "r", "upstream": "u", "outcome": outcome}}))


def test_latest_outcome_wins_and_planted_bug_runs_do_not_count(tmp_path: Path) -> None:
    _result(tmp_path, "a", "2026-01-01T00:00:00", "xfailed")
    _result(tmp_path, "a", "2026-01-02T00:00:00", "xpassed")
    _result(tmp_path, "a", "2026-01-03T00:00:00", "xfailed", bugs=["no-reconnect"])
    _result(tmp_path, "b", "2026-01-01T00:00:00", None)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "result.json").write_text("not json")
    got = latest_outcomes(tmp_path)
    assert got["a"][0] == "XPASS" and got["a"][2] == "2026-01-02T00:00:00"
    assert got["b"][0] == "inconclusive"


def test_finding_rows_cover_every_xfail_scenario_of_the_catalogue(tmp_path: Path) -> None:
    rows, bad = finding_rows(REPO / "scenarios", DOCS, tmp_path)
    assert bad == []
    names = {r.name for r in rows}
    assert {p.stem for p in SCENARIOS} <= names
    assert all(r.outcome is None for r in rows)  # nothing ran under tmp_path
    assert all(r.page for r in rows if "/findings/" in r.file)


def _kvchaos(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_kvchaos_findings_fails_on_xpass_only_when_asked(tmp_path: Path) -> None:
    name = SCENARIOS[0].stem
    _result(tmp_path, name, "2026-01-01T00:00:00", "xfailed")
    r = _kvchaos("findings", "--reports", str(tmp_path), "--fail-on-xpass", "--json")
    assert r.returncode == 0, r.stderr
    row = next(json.loads(line) for line in r.stdout.splitlines() if json.loads(line)["name"] == name)
    assert row["outcome"] == "XFAIL" and row["page"]
    _result(tmp_path, name, "2026-01-02T00:00:00", "xpassed")
    assert _kvchaos("findings", "--reports", str(tmp_path)).returncode == 0
    r = _kvchaos("findings", "--reports", str(tmp_path), "--fail-on-xpass")
    assert r.returncode == 1 and name in r.stderr


def test_kvchaos_list_shows_the_findings() -> None:
    r = _kvchaos("list", "scenarios", "--json")
    assert r.returncode == 0, r.stderr
    files = {json.loads(line)["file"] for line in r.stdout.splitlines()}
    for path in SCENARIOS:
        assert str(path.relative_to(REPO)) in files


def test_pytest_plugin_collects_the_findings_as_chaos_items() -> None:
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                        "-m", "chaos", "scenarios"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    for path in SCENARIOS:
        assert f"scenarios/findings/{path.name}::{path.stem}" in r.stdout, r.stdout


FAKE_RUN = '''
"""A -p plugin: every scenario "runs" to the verdict its name asks for (no stack)."""
import chaos.runner.run as run
import chaos.runner.stacks as stacks
from chaos.checks.result import CheckResult
from chaos.report.model import RunResult, XfailInfo

stacks.StackPool.acquire = lambda self, *a, **k: None
stacks.StackPool.release = lambda self, *a, **k: None
stacks.StackPool.close = lambda self: None


def fake_run(scenario, stack, run_dir, run_id, timeout_s=600, after_checks=None):
    kind = scenario.name.split("-")[1]
    x = XfailInfo(reason="r", upstream="u", outcome={"failed": "xfailed", "passed": "xpassed"}.get(kind))
    verdict = {"error": "unknown", "inconclusive": "unknown"}.get(kind, kind)
    check = CheckResult(name="evidence", verdict="unknown" if kind == "inconclusive" else "passed",
                        summary="inconclusive: trigger not reached")
    hit = CheckResult(name="hit_recovery", verdict="failed" if kind == "failed" else "passed", summary="0 of 6")
    return RunResult(run_id=run_id, scenario=scenario.name, verdict=verdict, exit_code=0, checks=[check, hit],
                     xfail=x, error="stack: lmcache did not start" if kind == "error" else None)


run.run_scenario = fake_run
'''


def test_pytest_shows_a_known_bug_only_when_a_check_failed(tmp_path: Path) -> None:
    """An xfail scenario is XFAIL only when its check failed as expected: one that could not
    run fails (an infrastructure error is not the known bug) and one that did not reach its
    window is skipped as inconclusive (both were XFAIL before)."""
    (tmp_path / "fakerun.py").write_text(FAKE_RUN)
    scen = tmp_path / "scen"
    scen.mkdir()
    src = (REPO / "scenarios/findings/restart-between-heartbeats.yaml").read_text()
    src = src.replace("stack: ../../compose/reference.yml", f"stack: {REPO / 'compose/reference.yml'}")
    for kind in ("failed", "passed", "inconclusive", "error"):
        (scen / f"xf-{kind}.yaml").write_text(src.replace("name: restart-between-heartbeats", f"name: xf-{kind}"))
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "fakerun", "-rA", "-m", "chaos",
                        "--kvchaos-scenarios", str(scen), "--kvchaos-report-dir", str(tmp_path / "reports"), str(scen)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    out = r.stdout + r.stderr
    assert "1 failed, 1 skipped, 1 xfailed, 1 xpassed" in out, out
    assert "FAILED" in out and "xf-error" in out and "could not run: stack: lmcache did not start" in out, out
    assert "SKIPPED" in out and "inconclusive, the known bug was not reached" in out, out
