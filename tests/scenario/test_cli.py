from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from chaos.scenario.cli import app, schema_text, stack_names

from .samples import GOOD

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_validate_ok_and_bad(write):
    good = write(GOOD, "good.yaml")
    r = runner.invoke(app, ["validate", str(good)])
    assert r.exit_code == 0, r.output
    assert f"{good}: ok" in r.output
    bad = write(GOOD.replace("link: engine-lmcache", "link: nowhere"), "bad.yaml")
    r = runner.invoke(app, ["validate", str(good), str(bad)])
    assert r.exit_code == 2
    assert f"{bad}:14: phases[1].faults[0].link: unknown link 'nowhere'" in r.output
    r = runner.invoke(app, ["validate", str(good.parent / "missing.yaml")])
    assert r.exit_code == 2 and "no such file or folder" in r.output


def test_stack_names(scenario_dir):
    assert stack_names(scenario_dir / "stack.yml") == (
        {"engine-lmcache", "lmcache-redis"}, {"engine", "lmcache", "toxiproxy"})
    (scenario_dir / "plain.yml").write_text("services: {a: {command: [x]}}\n")
    assert stack_names(scenario_dir / "plain.yml") == (set(), {"a"})


def test_invalid_stack_file_is_reported(write, scenario_dir):
    (scenario_dir / "stack.yml").write_text("services:\n  engine: {comand: [x]}\n")
    r = runner.invoke(app, ["validate", str(write(GOOD))])
    assert r.exit_code == 2 and "stack.yml:2: services.engine.comand: " in r.output


def test_schema_command(tmp_path):
    out = tmp_path / "s" / "scenario.schema.json"
    r = runner.invoke(app, ["schema", "--output", str(out)])
    assert r.exit_code == 0 and out.read_text() == schema_text()
    r = runner.invoke(app, ["schema", "-o", "-"])
    assert json.loads(r.output)["title"] == "kvchaos scenario"


def test_checked_in_schema_is_fresh():
    path = REPO / "schemas" / "scenario.schema.json"
    assert path.read_text() == schema_text(), (
        "schemas/scenario.schema.json is stale: run `kvchaos schema` and commit it")


def test_list(write, scenario_dir):
    write(GOOD, "a.yaml")
    r = runner.invoke(app, ["list", str(scenario_dir), "--json"])
    assert r.exit_code == 0, r.output  # stack.yml in the same folder is skipped: not a scenario
    rows = [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]
    assert rows == [{"name": "lookup-stall", "file": str(scenario_dir / "a.yaml"), "faults": ["latency"],
                     "checks": ["liveness", "leaks"], "xfail": None, "description": "test"}]
    r = runner.invoke(app, ["list", str(REPO / "scenarios")])
    assert r.exit_code == 0, r.output
    assert "lookup-timeout" in r.output and "smoke" in r.output


def test_xfail_leaks_name_fields_a_leak_source_reads(write):
    """A typo in ``xfail.leaks`` (a field nothing reads) would make every real leak of the
    known bug FAILED: validate names the file, the line and the fields the run reads (exit 2)."""
    good = write(GOOD + "xfail: {reason: known, leaks: [lmcache.active_sessions]}\n", "good.yaml")
    r = runner.invoke(app, ["validate", str(good)])
    assert r.exit_code == 0, r.output
    typo = write(GOOD + "xfail:\n  reason: known\n  leaks: [lmcache.active_session]\n", "typo.yaml")
    r = runner.invoke(app, ["validate", str(typo)])
    line = len(GOOD.splitlines()) + 3
    assert r.exit_code == 2
    assert (f"{typo}:{line}: xfail.leaks[0]: leak source 'lmcache' reads no field 'active_session'; "
            "it reads: active_sessions") in r.output, r.output
    elsewhere = write(GOOD + "xfail: {reason: k, stacks: [vllm-cpu], leaks: [lmcache.x]}\n", "other.yaml")
    assert runner.invoke(app, ["validate", str(elsewhere)]).exit_code == 0  # not expected to fail here
    # a source this stack has not (the reference stack's lock ledger): cannot leak here, no problem
    ledger = write(GOOD + "xfail: {reason: k, leaks: [lmcache.active_sessions, lmcache-lock-ledger.x]}\n", "l.yaml")
    assert runner.invoke(app, ["validate", str(ledger)]).exit_code == 0
