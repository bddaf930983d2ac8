from __future__ import annotations

import pytest

from chaos.faults.latency import LatencyParams
from chaos.scenario.loader import discover_scenarios, load_scenario, validate_against_stack
from chaos.scenario.model import Scenario
from chaos.yamlsource import ConfigError

from .samples import GOOD


def test_good_scenario_loads_with_defaults(write, scenario_dir):
    s = load_scenario(write(GOOD))
    assert s.name == "lookup-stall" and s.seed == 7
    assert s.stack == scenario_dir / "stack.yml"
    assert [p.name for p in s.phases] == ["warm", "stall"]
    fault = s.phases[1].faults[0]
    assert isinstance(fault, LatencyParams)
    assert (fault.start, fault.duration, fault.end_s()) == (0.5, 90.0, 90.5)
    assert fault.name == "latency-0" and fault.stream == "downstream" and fault.toxicity == 1.0
    assert s.checks.enabled() == ["liveness", "leaks"]  # `leaks:` (null) runs with defaults
    assert s.checks.leaks.quiesce_s == 15 and s.checks.leaks.sources is None
    assert s.checks.liveness.allow_failed_fraction == 0
    assert s.workload.prefix_lengths == [255, 256]
    assert s.phase_requests(s.phases[0]) == 4
    assert s.locator.line_of(("phases", 1, "faults", 0, "link")) == 14
    validate_against_stack(s, {"engine-lmcache"})


def _error(write, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        load_scenario(write(text))
    return ei.value


def test_unknown_fault_kind(write):
    e = _error(write, GOOD.replace("kind: latency", "kind: latencyy"))
    assert (e.line, e.field) == (13, "phases[1].faults[0]")
    assert "unknown kind 'latencyy'" in e.message and "'latency'" in e.message
    assert str(e).startswith(f"{e.file}:13: phases[1].faults[0]: ")


def test_negative_duration(write):
    e = _error(write, GOOD.replace("duration: 1m30s", "duration: -3s"))
    assert str(e) == f"{e.file}:17: phases[1].faults[0].duration: must be positive (got -3s)"


def test_negative_start(write):
    e = _error(write, GOOD.replace("start: 500ms", "start: -1"))
    assert (e.line, e.field) == (16, "phases[1].faults[0].start")


def test_unknown_key_anywhere(write):
    e = _error(write, GOOD.replace("  requests: 4\n", "  requets: 4\n"))
    assert (e.line, e.field) == (8, "workload.requets") and "unknown key" in e.message
    e = _error(write, GOOD.replace("        latency_ms: 3000\n", "        latency: 3000\n"))
    assert [p.split(": ")[1] for p in e.problems] == [
        "phases[1].faults[0].latency_ms", "phases[1].faults[0].latency"]
    e = _error(write, GOOD + "colour: blue\n")
    assert (e.line, e.field) == (21, "colour")


def test_bad_yaml(write):
    e = _error(write, GOOD.replace("  - name: warm\n", "  - name: [warm\n"))
    assert e.line is not None and e.column is not None
    assert str(e).startswith(f"{e.file}:{e.line}:{e.column}: YAML syntax")


def test_duration_and_until_exclusive(write):
    e = _error(write, GOOD.replace("duration: 1m30s", "duration: 1m30s\n        until: end"))
    assert e.field == "phases[1].faults[0]" and "not both" in e.message
    e = _error(write, GOOD.replace("        duration: 1m30s\n", ""))
    assert "exactly one of `duration`" in e.message


def test_until_end(write):
    s = load_scenario(write(GOOD.replace("duration: 1m30s", "until: end")))
    assert s.phases[1].faults[0].end_s() is None


def test_missing_stack_file(write, scenario_dir):
    (scenario_dir / "stack.yml").unlink()
    e = _error(write, GOOD)
    assert (e.line, e.field) == (3, "stack") and "stack.yml: file not found" in e.message
    assert load_scenario(write(GOOD), check_paths=False).stack.name == "stack.yml"


@pytest.mark.parametrize(
    "old, new, field, words",
    [
        ("name: lookup-stall", "name: Lookup Stall", "name", "pattern"),
        ("seed: 7", "seed: seven", "seed", "integer"),
        ("  - name: warm\n", "  - name: stall\n", "phases[1].name", "used twice (first at line 10)"),
        ("        start: 500ms\n", "        toxicity: 1.5\n        start: 500ms\n",
         "phases[1].faults[0].toxicity", "less than or equal to 1"),
        ("        link: engine-lmcache\n", "        link: engine-lmcache\n        stream: sideways\n",
         "phases[1].faults[0].stream", "upstream"),
        ("  liveness: {request_deadline_s: 30}\n  leaks:\n", "", "checks", "at least one check"),
        ("  families: 2\n", "  families: 0\n", "workload.families", "greater than or equal to 1"),
        ("prefix_tokens: [255, 256]", "prefix_tokens: []", "workload.prefix_tokens", "at least one"),
        ("  requests: 4\n", "  requests: 4\n  stream: 1.5\n", "workload.stream", "0..1"),
        ("  requests: 4\n", "  requests: 4\n  tenants: [a, a]\n", "workload.tenants", "distinct"),
        ("phases:\n  - name: warm\n", "phases:\n  - name: warm\n    requests: -1\n",
         "phases[0].requests", "greater than or equal to 0"),
        ("request_deadline_s: 30", "request_deadline_s: 0", "checks.liveness.request_deadline_s",
         "must be positive"),
        # YAML 1.1 reads `yes` as true: a count must be a real integer, not a bool or a string
        ("  requests: 4\n", "  requests: yes\n", "workload.requests", "valid integer"),
        ("latency_ms: 3000", "latency_ms: '3000'", "phases[1].faults[0].latency_ms", "valid integer"),
    ],
)
def test_bad_values_name_the_field(write, old, new, field, words):
    assert old in GOOD
    e = _error(write, GOOD.replace(old, new, 1))
    assert e.field == field, str(e)
    assert words in e.message, str(e)
    assert e.line is not None


def test_missing_required_keys(write):
    e = _error(write, "name: x\nstack: stack.yml\n")
    assert {p.split(": ")[1] for p in e.problems} == {"phases", "checks"}
    e = _error(write, "- a list\n")
    assert e.line == 1 and e.message == ("not a scenario file: expected a mapping with name, stack, phases "
                                         "and checks, found a list")


def test_fault_names_default_and_must_be_unique(write):
    text = GOOD.replace(
        "        duration: 1m30s\n",
        "        duration: 1m30s\n      - {kind: link_down, link: lmcache-redis, until: end}\n"
        "      - {kind: timeout, link: engine-lmcache, duration: 1, name: mine}\n",
    )
    s = load_scenario(write(text))
    assert [f.name for _, _, f in s.faults()] == ["latency-0", "link_down-1", "mine"]
    e = _error(write, text.replace("name: mine", "name: latency-0"))
    assert "used twice" in e.message


def test_unknown_link_against_stack(write):
    s = load_scenario(write(GOOD.replace("link: engine-lmcache", "link: engine-lmcach")))
    with pytest.raises(ConfigError) as ei:
        validate_against_stack(s, {"engine-lmcache", "lmcache-redis"})
    e = ei.value
    assert (e.file, e.line, e.field) == (str(s.source), 14, "phases[1].faults[0].link")
    assert e.message == "unknown link 'engine-lmcach'; the stack has: engine-lmcache, lmcache-redis"


def test_validate_against_stack_without_source():
    s = Scenario.model_validate(
        {"name": "x", "stack": "s.yml", "phases": [{"name": "p", "faults": [
            {"kind": "latency", "link": "nope", "latency_ms": 1, "duration": 1}]}],
         "checks": {"liveness": {}}},
        context={"check_paths": False},
    )
    with pytest.raises(ConfigError, match="unknown link 'nope'") as ei:
        validate_against_stack(s, set())
    assert ei.value.line is None and "the stack has: none" in ei.value.message


def test_discover(scenario_dir, write):
    write(GOOD, "b.yaml")
    write(GOOD, "a.yml")
    (scenario_dir / "sub").mkdir()
    write(GOOD, "sub/c.yaml")
    names = [p.relative_to(scenario_dir).as_posix() for p in discover_scenarios(scenario_dir)]
    assert names == ["a.yml", "b.yaml", "sub/c.yaml"]  # stack.yml beside them is a stack, not a scenario
    with pytest.raises(ConfigError):
        discover_scenarios(scenario_dir / "nope")
