"""chaos.report.compare: verdicts of two report folders, scenario by scenario."""

from __future__ import annotations

import json
from pathlib import Path

from chaos.report.compare import main


def _run(folder: Path, run_id: str, scenario: str, verdict: str, exit_code: int, started: str,
         faults: list[dict] | None = None) -> None:
    d = folder / run_id
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"run_id": run_id, "scenario": scenario, "verdict": verdict,
                                               "exit_code": exit_code, "started_at": started,
                                               "faults": faults or []}))


def test_same_verdicts_then_a_difference_and_an_unbitten_fault(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    _run(a, "r1", "smoke", "passed", 0, "1")
    _run(a, "r2", "lookup", "failed", 1, "1")
    _run(a, "r3", "lookup", "passed", 0, "2")  # the last run of a scenario counts
    _run(b, "r4", "smoke", "passed", 0, "1")
    _run(b, "r5", "lookup", "passed", 0, "1", [{"fault_id": "f", "kind": "latency", "bit": True}])
    assert main([str(a), str(b), "--require-bitten"]) == 0
    _run(b, "r6", "lookup", "unknown", 4, "3",
         [{"fault_id": "f", "kind": "latency", "bit": False, "evidence": {"reason": "no bytes"}}])
    assert main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "lookup: passed (exit 0) vs unknown (exit 4): f (latency): no bytes" in out
    assert main([str(a), str(tmp_path / "empty")]) == 2
