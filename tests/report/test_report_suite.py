import io
import json
import xml.etree.ElementTree as ET

from rich.console import Console

from chaos.checks import CheckResult
from chaos.report import build_result, print_suite, write_suite


def _run(name, verdicts, error=None):
    checks = [CheckResult(name=n, verdict=v, summary=f"{n} said {v}") for n, v in verdicts.items()]
    return build_result(run_id=f"r-{name}", scenario=name, history=[], checks=checks, seed=1, error=error)


def test_suite_json_junit_and_table(tmp_path):
    runs = [_run("clean", {"liveness": "passed"}),
            _run("stall", {"liveness": "passed", "leaks": "failed"}),
            _run("dull", {"evidence": "unknown"})]
    suite = write_suite(tmp_path, "nightly", runs)
    assert suite.verdict == "failed" and suite.exit_code == 1
    data = json.loads((tmp_path / "suite.json").read_text())
    assert [r["scenario"] for r in data["runs"]] == ["clean", "stall", "dull"]
    assert data["runs"][1]["summary"] == "leaks: leaks said failed"
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert [s.get("name") for s in root.findall("testsuite")] == ["kvchaos.clean", "kvchaos.stall", "kvchaos.dull"]
    assert root.get("tests") == "4" and root.get("failures") == "1" and root.get("errors") == "1"
    buf = io.StringIO()
    print_suite(suite, Console(file=buf, width=160))
    out = buf.getvalue()
    assert "nightly" in out and "stall" in out and "leaks said failed" in out


def test_suite_exit_code_priority(tmp_path):
    assert write_suite(tmp_path, "s", [_run("a", {"x": "unknown"}), _run("b", {"x": "passed"})]).exit_code == 4
    assert write_suite(tmp_path, "s", [_run("a", {"x": "unknown"}), _run("b", {}, error="boom")]).exit_code == 3
    assert write_suite(tmp_path, "s", [_run("a", {"x": "passed"})]).exit_code == 0
