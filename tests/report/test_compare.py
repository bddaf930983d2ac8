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


def test_expected_verdicts_count_xpass_and_inconclusive_findings_as_false(tmp_path, capsys):
    """`--expected`: a clean scenario must pass, a finding (xfail) must XFAIL; an XPASS of a
    known bug of the pinned LMCache, an inconclusive finding, an unbitten fault are false."""
    def run(folder, run_id, scenario, verdict, code, xfail=False, faults=None):
        _run(folder, run_id, scenario, verdict, code, "1", faults)
        if xfail:
            p = folder / run_id / "result.json"
            p.write_text(json.dumps(dict(json.loads(p.read_text()), xfail={"reason": "bug"})))

    good, bad = tmp_path / "good", tmp_path / "bad"
    run(good, "r1", "smoke", "passed", 0)
    run(good, "r2", "finding", "failed", 0, xfail=True)
    assert main(["--expected", str(good), "--require-bitten"]) == 0
    run(bad, "r3", "smoke", "passed", 0, faults=[{"fault_id": "f", "kind": "latency", "bit": False}])
    run(bad, "r4", "finding", "passed", 0, xfail=True)
    run(bad, "r5", "other-finding", "unknown", 4, xfail=True)
    run(bad, "r6", "clean", "failed", 1)
    assert main(["--expected", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "finding: XPASS (exit 0, run r4), expected XFAIL" in out
    assert "other-finding: unknown (exit 4, run r5), expected XFAIL" in out
    assert "clean: failed (exit 1, run r6), expected passed" in out
    assert f"{good}: 2 scenarios, 0 false verdict(s)" in out and f"{bad}: 4 scenarios, 3 false verdict(s)" in out
    assert main(["--expected", str(bad), "--require-bitten"]) == 1
    assert "smoke: fault f (latency): did not bite (run r3)" in capsys.readouterr().out
    assert main(["--expected"]) == 2


def test_each_folder_says_which_proxy_served_it_and_a_mixed_folder_is_flagged(tmp_path, capsys):
    """A comparison of the bundled proxy with the real one must show that the real one ran
    (a silent fall-back to the bundled proxy would compare a proxy with itself)."""
    a, b = tmp_path / "bundled", tmp_path / "real"
    for folder, rid, impl, version in ((a, "r1", "bundled", "0.1.0"), (b, "r2", "real", "2.9.0")):
        _run(folder, rid, "smoke", "passed", 0, "1")
        data = json.loads((folder / rid / "result.json").read_text())
        data["proxy"] = {"impl": impl, "version": version, "api": "http://127.0.0.1:1"}
        (folder / rid / "result.json").write_text(json.dumps(data))
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"{a}: proxy bundled 0.1.0 (1 run)" in out and f"{b}: proxy real 2.9.0 (1 run)" in out
    assert "more than one proxy" not in out
    _run(b, "r3", "lookup", "passed", 0, "1")  # an older report: no proxy recorded
    main([str(a), str(b)])
    out = capsys.readouterr().out
    assert f"{b}: proxy none recorded (1 run), real 2.9.0 (1 run)  <- more than one proxy in one folder" in out


def test_subset_compares_only_what_the_second_folder_ran(tmp_path, capsys):
    """`--subset`: `make test` runs only the network-fault scenarios with the real Toxiproxy; the
    rest of the bundled catalogue is no difference, but a verdict that differs still is, and so
    is a scenario the second folder ran that the first did not."""
    bundled, real = tmp_path / "bundled", tmp_path / "real"
    _run(bundled, "r1", "smoke", "passed", 0, "1")
    _run(bundled, "r2", "lookup", "passed", 0, "1")
    _run(real, "r3", "lookup", "passed", 0, "1")
    assert main([str(bundled), str(real)]) == 1  # without --subset, smoke ran only in the first
    assert main([str(bundled), str(real), "--subset"]) == 0
    assert "1 scenarios, 0 difference(s)" in capsys.readouterr().out
    _run(real, "r4", "lookup", "unknown", 4, "2")
    _run(real, "r5", "partial", "passed", 0, "1")
    assert main([str(bundled), str(real), "--subset"]) == 1
    out = capsys.readouterr().out
    assert "lookup: passed (exit 0) vs unknown (exit 4)" in out
    assert "partial: ran only in the second folder" in out
