"""A run whose checks pass while a window is not proven (`trigger: none`) is "passed (window not
proven)" everywhere a person or a CI reads it, never plain "passed": result.json, exit code 5,
JUnit (a skipped evidence case), the suite (its verdict and exit code), report.html."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET

from rich.console import Console

from chaos.checks import CheckResult
from chaos.report import build_result, print_suite, write_suite
from chaos.report.html import render_html
from chaos.report.junit import write_junit
from chaos.report.model import EXIT_UNPROVEN, UNPROVEN


def _run(name: str, unproven: list[str], other: str = "passed"):
    checks = [CheckResult(name="liveness", verdict=other, summary=f"liveness {other}"),
              CheckResult(name="evidence", verdict="passed", summary="faults acted: 1 of 1; windows not proven: 1",
                          details={"faults": [], "phases": [], "unproven": unproven})]
    return build_result(run_id=f"r-{name}", scenario=name, history=[], checks=checks, seed=1)


def test_unproven_run_is_never_plain_passed_and_exits_5():
    r = _run("u", ["latency f (phase p): trigger: none (heartbeats only)"])
    assert r.verdict == UNPROVEN == "passed (window not proven)"
    assert r.exit_code == EXIT_UNPROVEN == 5
    assert json.loads(r.model_dump_json())["verdict"] == "passed (window not proven)"
    proven = _run("p", [])
    assert proven.verdict == "passed" and proven.exit_code == 0


def test_a_failed_or_inconclusive_check_wins_over_unproven():
    assert _run("f", ["x"], other="failed").verdict == "failed"
    u = _run("u", ["x"], other="unknown")
    assert u.verdict == "unknown" and u.exit_code == 4


def test_junit_marks_the_evidence_case_skipped(tmp_path):
    root = ET.parse(write_junit(tmp_path / "j.xml", [_run("u", ["x"])])).getroot()
    suite = root.find("testsuite")
    (case,) = [c for c in suite.findall("testcase") if c.get("name") == "evidence"]
    skipped = case.find("skipped")
    assert skipped is not None and skipped.get("type") == "window-not-proven"
    assert skipped.get("message").startswith("passed (window not proven): ")
    assert suite.get("skipped") == "1"
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["verdict"] == UNPROVEN and props["exit_code"] == "5"


def test_suite_verdict_and_exit_code(tmp_path):
    suite = write_suite(tmp_path, "s", [_run("a", []), _run("u", ["x"])])
    assert suite.verdict == UNPROVEN and suite.exit_code == 5
    data = json.loads((tmp_path / "suite.json").read_text())
    assert data["runs"][1]["summary"].startswith("window not proven: ")
    buf = io.StringIO()
    print_suite(suite, Console(file=buf, width=160))
    assert "passed (window not proven)" in buf.getvalue()
    worse = write_suite(tmp_path / "w", "w", [_run("u", ["x"]), _run("i", [], other="unknown")])
    assert worse.verdict == "unknown" and worse.exit_code == 4


def test_html_badge_is_not_the_passed_one():
    html = render_html(_run("u", ["x"]), [])
    assert 'class="badge unproven" id="verdict">passed (window not proven)<' in html
