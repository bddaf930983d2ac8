import json

import pytest

from chaos.report import ReportError, RunResult, render_report
from chaos.report.cli import report
from chaos.report.result import exit_code


def test_result_json_round_trips(run_dir, synthetic):
    _, _, result = synthetic
    loaded = RunResult.model_validate_json((run_dir / "result.json").read_text())
    assert loaded == result
    data = json.loads((run_dir / "result.json").read_text())
    assert data["scenario"] == "lookup-stall-during-warm-hits" and data["seed"] == 7
    assert data["verdict"] == "failed" and data["exit_code"] == 1
    assert [c["name"] for c in data["checks"]][0] == "recompute_equivalence"
    faults = {f["fault_id"]: f for f in data["faults"]}
    assert faults["stall-latency"]["applied_at"] == pytest.approx(12.02)
    assert faults["stall-latency"]["healed_at"] == pytest.approx(20.01)
    assert faults["stall-latency"]["evidence"]["bit"] is True and faults["kill-redis"]["bit"] is False
    assert [p["name"] for p in data["phases"]] == ["warm", "stall", "recover"]
    assert data["paths"]["history"] == "history.jsonl" and data["stats"]["definitions"]["token_hit_rate"]


def test_render_report_rebuilds_html_and_junit(run_dir):
    (run_dir / "report.html").unlink()
    (run_dir / "junit.xml").unlink()
    html = render_report(run_dir)
    assert html.exists() and (run_dir / "junit.xml").exists()
    assert 'class="bar' in html.read_text()


def test_render_report_errors_name_the_file(tmp_path, run_dir):
    with pytest.raises(ReportError, match="result.json"):
        render_report(tmp_path / "nothing")
    (run_dir / "history.jsonl").write_text('{"index": 0}\n{"index": 1}\n')
    with pytest.raises(ReportError, match="history.jsonl:1"):
        render_report(run_dir)


def test_cli_report_exit_codes(tmp_path, run_dir, capsys):
    assert report(run_dir) == 0
    assert report(tmp_path / "missing") == 2


def test_exit_codes():
    assert exit_code("passed") == 0 and exit_code("failed") == 1 and exit_code("unknown") == 4
    from chaos.report import XfailInfo
    xf = XfailInfo(reason="known")
    assert exit_code("failed", xf) == 0 and exit_code("passed", xf) == 0 and exit_code("unknown", xf) == 4
    assert exit_code("passed", error="stack down") == 3
