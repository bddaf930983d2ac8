"""docs/reach.md cannot go stale: every snippet validates (as trigger conditions or faults) and
resolves on the stack named above it (services, links, HTTP addresses, wrappable L2 adapters),
and the engine metric names it lists are the reference engine's."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from chaos.engine.metrics import _HELP as ENGINE_METRICS
from chaos.faults.l2_fault_inject import wrappable_adapters
from chaos.probes import Condition, trigger_problems
from chaos.scenario.model import Scenario
from chaos.stack.spec import load_stack

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "reach.md").read_text()
SNIPPETS = re.findall(r"<!-- stack: (\S+) -->\n```yaml\n(.*?)```", DOC, re.S)


def stack(name: str) -> SimpleNamespace:
    spec = load_stack(REPO / name, allocate_ports=False, require_commands=False)
    return SimpleNamespace(spec=spec, settings=spec.settings, env=spec.env, backend="compose")


def test_there_are_snippets_for_both_stacks():
    assert {s for s, _ in SNIPPETS} == {"compose/reference.yml", "compose/vllm-lmcache.yml"}
    assert len(SNIPPETS) >= 7


@pytest.mark.parametrize("stack_file,text", SNIPPETS, ids=[f"{i}-{s}" for i, (s, _) in enumerate(SNIPPETS)])
def test_snippet_validates_on_its_stack(stack_file, text):
    st = stack(stack_file)
    items = yaml.safe_load(text)
    assert isinstance(items, list) and items
    faults = [i for i in items if "kind" in i]
    conditions = [Condition.model_validate(i) for i in items if "kind" not in i]
    assert trigger_problems(conditions, st.settings, set(st.spec.services)) == []
    for c in conditions:
        for m in c.metric_names:
            if c.service == "engine" and "reference" in stack_file:
                assert m in ENGINE_METRICS, m
            if c.service == "lmcache":
                assert f"`{m}`" in DOC.split("## Logs")[0], f"{m} is not in the metric table"
    if faults:
        s = Scenario.model_validate({"name": "x", "stack": "s.yml", "phases": [{"name": "p", "faults": faults}],
                                     "checks": {"evidence": {}}}, context={"check_paths": False})
        for f in s.phases[0].faults:
            for kind, name in f.stack_refs().items():
                have = st.settings.links if kind == "link" else st.spec.services
                assert name in have, (kind, name)
            if f.kind == "l2_fault_inject":
                assert set(f.adapters or []) <= {a.type for a in wrappable_adapters(st)}


def test_every_engine_metric_is_listed():
    listed = DOC.split("## The reference engine")[1].split("## LMCache")[0]
    missing = [m for m in ENGINE_METRICS if f"`{m}`" not in listed]
    assert not missing, missing


@pytest.mark.parametrize("stack_file", ["compose/reference.yml", "compose/vllm-cpu.yml"])
def test_every_lmcache_server_variable_of_a_shipped_stack_is_listed(stack_file):
    """Issue 34: LMCache's server variables (LMCACHE_L1_READ_TTL_SECONDS, ...) were found only
    in a findings scenario. Every LMCACHE_* variable a shipped stack reads, except its ports, is
    in docs/reach.md's table."""
    names = set(re.findall(r"\$\{(LMCACHE_[A-Z0-9_]+)", (REPO / stack_file).read_text()))
    table = DOC.split("### LMCache server variables")[1].split("###")[0]
    missing = sorted(n for n in names if not n.endswith("_PORT") and f"`{n}`" not in table)
    assert names and not missing, missing
