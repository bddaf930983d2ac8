import xml.etree.ElementTree as ET

from chaos.report.junit import write_junit


def test_run_junit_parses_one_suite_one_case_per_check(run_dir, synthetic):
    _, _, result = synthetic
    root = ET.parse(run_dir / "junit.xml").getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "kvchaos.lookup-stall-during-warm-hits"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == ["recompute_equivalence", "liveness", "leaks", "evidence", "isolation"]
    assert suite.get("tests") == "5" and suite.get("failures") == "3" and suite.get("errors") == "1"
    fail = cases["recompute_equivalence"].find("failure")
    assert fail is not None and fail.get("message") == result.checks[0].summary
    assert "token 0 differs: expected 104, got 7" in fail.get("message")
    assert cases["evidence"].find("error").get("type") == "inconclusive"
    assert cases["isolation"].find("failure") is None and cases["isolation"].find("error") is None
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["seed"] == "7" and props["verdict"] == "failed"


def test_xfail_failure_is_skipped_not_failed(tmp_path, make_result):
    r = make_result(xfail={"reason": "LMCache issue 2206", "upstream": "LMCache issue 2206"})
    assert r.xfail.outcome == "xfailed" and r.exit_code == 0
    path = write_junit(tmp_path / "j.xml", [r])
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite.get("failures") == "0" and suite.get("skipped") == "3"
    skipped = suite.find("testcase[@name='leaks']/skipped")
    assert skipped.get("type") == "xfail" and "LMCache issue 2206" in skipped.get("message")


def test_infrastructure_error_is_an_error_case(tmp_path, make_result):
    r = make_result(error="stack did not start: engine unhealthy after 60s")
    assert r.verdict == "unknown" and r.exit_code == 3
    suite = ET.parse(write_junit(tmp_path / "j.xml", [r])).getroot().find("testsuite")
    assert suite.find("testcase[@name='run']/error").get("type") == "infrastructure"
