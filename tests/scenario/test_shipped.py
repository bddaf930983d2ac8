"""The shipped catalogue validates against the stack each scenario names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chaos.scenario.cli import stack_names
from chaos.scenario.loader import discover_scenarios, load_scenario, validate_against_stack

REPO = Path(__file__).resolve().parents[2]
SHIPPED = discover_scenarios(REPO / "scenarios")


def test_catalogue_has_the_basics():
    names = {p.stem for p in SHIPPED}
    assert {"smoke", "lookup-timeout"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_scenario_validates(path):
    s = load_scenario(path)
    assert s.name == path.stem, "a scenario's file is named after it"
    up = "../" * len(path.relative_to(REPO / "scenarios").parts)  # scenarios/findings/x.yaml: ../../
    assert path.read_text().startswith(f"# yaml-language-server: $schema={up}schemas/scenario.schema.json")
    links, services = stack_names(s.stack)
    assert links, f"{s.stack} has no x-kvchaos.links"
    validate_against_stack(s, links, services)


def test_lookup_timeout_outlasts_the_mq_timeout():
    s = load_scenario(REPO / "scenarios" / "lookup-timeout.yaml")
    (fault,) = [f for _, _, f in s.faults()]
    assert fault.kind == "latency" and fault.link == "engine-lmcache"
    m = re.search(r"--lmcache-mq-timeout,\s*\"\$\{LMCACHE_MQ_TIMEOUT:-([0-9.]+)\}\"", s.stack.read_text())
    assert m, "the reference engine's MQ timeout is no longer set where this scenario expects it"
    assert fault.latency_ms > float(m.group(1)) * 1000
    assert s.checks.evidence is not None
