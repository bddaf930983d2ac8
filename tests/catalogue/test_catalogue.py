"""The shipped catalogue: every scenario validates and says which production failure it models
(a field report F1-F12, a mission fault, the production ladder, or a compound of them);
docs/catalogue.md lists every scenario file and every field report; every field report is
modelled by at least one scenario."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chaos.faults import STORE_OR_LOAD_WINDOWS
from chaos.runner.suite import load_and_validate
from chaos.scenario.loader import discover_scenarios, load_scenario

REPO = Path(__file__).resolve().parents[2]
SHIPPED = discover_scenarios(REPO / "scenarios")
CATALOGUE_DOC = REPO / "docs" / "catalogue.md"
FIELD_REPORTS = [f"F{i}" for i in range(1, 13)]
_F = re.compile(r"\bF(1[0-2]|[1-9])\b")
_CLASS = re.compile(r"mission fault|production ladder|compound", re.IGNORECASE)


def test_catalogue_validates_against_its_stacks() -> None:
    assert len(load_and_validate(SHIPPED)) == len(SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_description_names_what_it_models(path: Path) -> None:
    s = load_scenario(path)
    assert s.description and len(s.description) > 80, f"{path.name}: describe the production failure"
    assert _F.search(s.description) or _CLASS.search(s.description), (
        f"{path.name}: the description names no field report (F1-F12), mission fault, "
        "production ladder step or compound")


def test_every_field_report_has_a_scenario() -> None:
    named = {f"F{m}" for p in SHIPPED for m in _F.findall(load_scenario(p).description or "")}
    assert set(FIELD_REPORTS) <= named, f"no scenario models {sorted(set(FIELD_REPORTS) - named)}"


def test_catalogue_doc_lists_every_scenario_and_field_report() -> None:
    text = CATALOGUE_DOC.read_text()
    shipped = {p.relative_to(REPO / "scenarios").as_posix() for p in SHIPPED}  # findings/x.yaml
    for rel in shipped:
        assert f"scenarios/{rel}" in text, f"docs/catalogue.md misses scenarios/{rel}"
    for f in FIELD_REPORTS:
        assert re.search(rf"\b{f}\b", text), f"docs/catalogue.md misses {f}"
    listed = set(re.findall(r"scenarios/((?:[a-z0-9-]+/)*[a-z0-9-]+\.yaml)", text))
    stale = listed - shipped
    assert not stale, f"docs/catalogue.md lists scenarios that do not exist: {sorted(stale)}"


def test_f1_f2_sweep_chunk_boundaries_with_local_prefix_cache() -> None:
    """F1: k*256+r lengths; F2: N*256-1, N*256, N*256+1; both with the engine's own prefix cache."""
    for path in SHIPPED:
        s = load_scenario(path)
        desc = s.description or ""
        lengths = s.workload.prefix_tokens if isinstance(s.workload.prefix_tokens, list) else [s.workload.prefix_tokens]
        if re.search(r"\bF1\b", desc) and s.engine.prefix_caching:
            assert any(n % 256 for n in lengths) and any(n > 256 for n in lengths)
        if re.search(r"\bF2\b", desc) and s.engine.prefix_caching:
            assert any(n % 256 == 0 and n - 1 in lengths and n + 1 in lengths for n in lengths)


def test_f12_scenario_has_tenants_and_isolation() -> None:
    f12 = [load_scenario(p) for p in SHIPPED if re.search(r"\bF12\b", load_scenario(p).description or "")]
    assert any(s.workload.tenants not in (1, None) and s.checks.isolation is not None for s in f12)


def test_f11_scenario_kills_lmcache_and_checks_hit_recovery() -> None:
    ok = False
    for path in SHIPPED:
        s = load_scenario(path)
        kills = [f for _, _, f in s.faults() if f.kind == "kill" and f.service == "lmcache"]
        if kills and s.checks.hit_recovery is not None:
            ok = True
    assert ok, "F11 needs a kill + restart of lmcache and hit_recovery on the phase after"


def test_at_least_two_compound_scenarios() -> None:
    """Two faults overlapping in time within one phase."""
    compound = []
    for path in SHIPPED:
        s = load_scenario(path)
        for phase in s.phases:
            spans = [(f.start, f.start + (f.duration or 1e9)) for f in phase.faults]
            if any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(spans) for b in spans[i + 1:]):
                compound.append(s.name)
                break
    assert len(compound) >= 2, compound


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_scenario_declares_its_trigger_and_window(path: Path) -> None:
    """Issue 12: no hollow passes. A trigger on a fault or a phase says the failure window was
    reached; the description says which window (and the evidence check judges it)."""
    s = load_scenario(path)
    triggers = [c for p in s.phases for c in p.trigger] + [c for _, _, f in s.faults() for c in f.trigger]
    assert triggers, f"{path.name}: declare a `trigger` on a fault or a phase (docs/scenarios.md, Triggers)"
    assert s.checks.evidence is not None
    assert "Window" in (s.description or ""), f"{path.name}: the description should say which window it hits"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_no_program_text_in_yaml(path: Path) -> None:
    """No Python (or shell) one-liners nested in YAML quoting: what a hook did by hand has a kind."""
    text = path.read_text()
    assert not re.search(r"\bpython3?\b\s*,\s*-c\b|\bsh\b\s*,\s*-c\b|\bbash\b\s*,\s*-c\b", text), path.name
    assert "kind: hook" not in text, f"{path.name}: use a fault kind (tier_flush, retrieve_fail, ...) instead"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_a_store_or_load_window_lasts_as_long_as_the_phases_requests(path: Path) -> None:
    """A fault whose window is the stores or loads of its own phase's requests, in a phase that
    sends requests, lasts ``until: end`` (the phase ends after its requests), never a fixed
    ``duration`` that the requests can outlast on a slow host.

    The input that showed it: l2-tiers-down-compound in a catalogue run on a loaded host (8 busy
    loops, load 11-23 on 2 cores): its `disk_full` lasted a fixed 6 s, the phase's requests took
    9.5 s each (1-2 s on a quiet host) and stored only after the fill was healed: "fill-l2fs
    (disk_full): did not bite ... submitted_chunks=0, stored_chunks=0 ... no L2 store was
    attempted while the disk was full", an inconclusive run that fails `pytest -m chaos`."""
    s = load_scenario(path)
    for phase in s.phases:
        if not s.phase_requests(phase):
            continue  # a phase that sends nothing: its window is a later phase's (the fault's trigger says)
        for fault in phase.faults:
            if fault.kind in STORE_OR_LOAD_WINDOWS and fault.after == "phase_start":
                assert fault.until == "end", (
                    f"{path.name}: phase {phase.name}: fault {fault.name or fault.kind} ({fault.kind}) lasts a "
                    f"fixed {fault.duration} s, which the phase's requests can outlast on a slow host "
                    "before they store or load: write `until: end`")
