"""docs/scenarios.md cannot go stale: every schema field and every fault kind is documented."""

from __future__ import annotations

import re
from pathlib import Path

from chaos.faults import registry
from chaos.faults.base import FaultParams
from chaos.faults.network import ToxicParams
from chaos.scenario.model import Scenario

REPO = Path(__file__).resolve().parents[2]
GUIDE = (REPO / "docs" / "scenarios.md").read_text()


def _property_names(node) -> set[str]:
    names: set[str] = set()
    if isinstance(node, dict):
        names |= set((node.get("properties") or {}).keys())
        for v in node.values():
            names |= _property_names(v)
    elif isinstance(node, list):
        for v in node:
            names |= _property_names(v)
    return names


def test_every_schema_field_is_in_the_guide():
    fields = _property_names(Scenario.json_schema())
    assert len(fields) > 30
    missing = sorted(f for f in fields if f"`{f}`" not in GUIDE)
    assert not missing, f"docs/scenarios.md does not mention these scenario fields: {missing}"


def _section(kind: str) -> str:
    m = re.search(rf"^#### `{re.escape(kind)}`\n(.*?)(?=^#{{2,4}} )", GUIDE, re.S | re.M)
    assert m, (f"docs/scenarios.md has no '#### `{kind}`' section: document the fault kind there, "
               "with its fields and a one-line YAML example (see 'Adding a fault kind')")
    return m.group(1)


def test_every_fault_kind_has_a_section_naming_its_fields():
    common = set(ToxicParams.model_fields) | set(FaultParams.model_fields)
    for kind in registry.kinds():
        body = _section(kind)
        own = set(registry.get(kind).params_model.model_fields) - common
        missing = sorted(f for f in own if f"`{f}`" not in body)
        assert not missing, f"section `{kind}` does not mention {missing}"
        assert f"kind: {kind}" in body, f"section `{kind}` has no example"


def test_guide_examples_are_valid_scenario_yaml(tmp_path):
    import yaml

    from chaos.faults.registry import build_fault

    examples = re.findall(r"```yaml\n(.*?)```", GUIDE, re.S)
    faults = [e for e in examples if e.startswith("- {kind:")]
    assert len(faults) == len(registry.kinds())
    for text in faults:
        (item,) = yaml.safe_load(text)
        s = Scenario.model_validate(
            {"name": "x", "stack": "s.yml", "phases": [{"name": "p", "faults": [item]}],
             "checks": {"evidence": {}}}, context={"check_paths": False})
        build_fault(s.phases[0].faults[0])
    full = [e for e in examples if e.startswith("# yaml-language-server") and "phases:" in e]
    assert len(full) == 1
    (tmp_path / "s.yml").write_text("services: {}\n")
    data = yaml.safe_load(full[0])
    data["stack"] = str(tmp_path / "s.yml")
    Scenario.model_validate(data)
