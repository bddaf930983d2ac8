"""The engine path coverage of the catalogue (chaos/coverage.py, docs/coverage.md):

- every named path points at code that exists (function + line text, one statement);
- docs/catalogue.md's field-report map and docs/coverage.md are what the stored measurement
  (docs/coverage.json) renders, and the measurement knows every named path and field report;
- every field report's window is reached by at least one scenario of the measurement;
- ``summarize`` attributes lines and branches to the scenario (dynamic context) that ran them,
  on coverage data recorded here in-process.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from chaos import coverage as cc

SUMMARY = json.loads(cc.SUMMARY_PATH.read_text())
REPORTS = [f"F{i}" for i in range(1, 13)]


def test_every_named_path_points_at_code_that_exists():
    located = cc.resolve_paths()
    assert set(located) == {p.name for p in cc.NAMED_PATHS}


def test_a_named_path_whose_line_is_gone_fails(tmp_path: Path):
    (tmp_path / "chaos" / "engine").mkdir(parents=True)
    for rel in cc.ENGINE_FILES.values():
        (tmp_path / rel).write_text((cc.ROOT / rel).read_text().replace("if hit <= local_hit:", "if hit < local_hit:"))
    with pytest.raises(cc.PathMapError, match="load.local-covers-hit: chaos/engine/scheduler.py: "
                                              "EngineCore._load_external has no line starting with"):
        cc.resolve_paths(tmp_path)


def test_ambiguous_or_missing_function_is_reported():
    paths = [cc.NamedPath("x.a", "scheduler", "EngineCore._nope", "pass", "gone"),
             cc.NamedPath("x.b", "connector", "LMCacheConnector.retrieve", "log.warning(", "three of them"),
             cc.NamedPath("x.b", "connector", "LMCacheConnector.retrieve", "if dropped:", "twice named", body=True)]
    with pytest.raises(cc.PathMapError) as err:
        cc.resolve_paths(paths=paths)
    text = str(err.value)
    assert "named paths given twice: ['x.b']" in text
    assert "x.a: chaos/engine/scheduler.py: no function EngineCore._nope" in text
    assert "lines starting with 'log.warning('" in text


def test_every_field_report_has_a_requirement_naming_known_paths():
    assert [r.report for r in cc.REPORT_PATHS] == REPORTS
    known = {p.name for p in cc.NAMED_PATHS}
    for rp in cc.REPORT_PATHS:
        assert rp.ways, rp.report
        for way in rp.ways:
            assert set(way.paths) | set(way.any_paths) <= known, rp.report


def test_stored_measurement_knows_every_named_path_and_report():
    missing = {p.name for p in cc.NAMED_PATHS} - set(SUMMARY["named_paths"])
    assert not missing, f"named paths not in docs/coverage.json: {sorted(missing)}; run `make coverage`"
    assert set(SUMMARY["reports"]) == set(REPORTS)


def test_every_field_report_window_is_reached_by_a_scenario():
    unreached = [r for r, v in SUMMARY["reports"].items() if not v["scenarios"]]
    assert not unreached, f"no scenario reaches the window of {unreached}"


def test_docs_are_generated_from_the_stored_measurement():
    assert cc.check_docs(SUMMARY) == []


def test_check_docs_notices_a_hand_edit(tmp_path: Path):
    cat = tmp_path / "catalogue.md"
    cat.write_text("# x\n\n" + cc.render_catalogue_map(SUMMARY).replace("| F8 (", "| F8 edited (") + "\n")
    md = tmp_path / "coverage.md"
    md.write_text(cc.render_coverage_md(SUMMARY))
    assert cc.check_docs(SUMMARY, cat, md) == [f"{cat}: the field-report map differs from docs/coverage.json"]
    cat.write_text("no block\n")
    md.write_text("stale\n")
    assert cc.check_docs(SUMMARY, cat, md) == [f"{cat}: the generated field-report map is missing",
                                               f"{md}: differs from docs/coverage.json"]


def test_update_docs_replaces_only_the_generated_block(tmp_path: Path):
    cat = tmp_path / "catalogue.md"
    cat.write_text(f"before\n\n{cc.BEGIN_MARK}\nSTALE-LINE\n{cc.END_MARK}\n\nafter\n")
    md = tmp_path / "coverage.md"
    cc.update_docs(SUMMARY, cat, md)
    text = cat.read_text()
    assert text.startswith("before\n\n") and text.endswith("\n\nafter\n") and "STALE-LINE" not in text
    assert cc.check_docs(SUMMARY, cat, md) == []


def test_requirements_need_paths_faults_and_tenants():
    way = cc.Requirement(paths=("a",), any_paths=("b", "c"), faults=("kill@redis", "disk_full"), tenants=True)
    facts = {"faults": ["kill@redis"], "tenants": 2}
    assert cc._meets(way, {"a", "c"}, facts)
    assert not cc._meets(way, {"c"}, facts)
    assert not cc._meets(way, {"a"}, facts)
    assert not cc._meets(way, {"a", "b"}, {"faults": ["kill@lmcache"], "tenants": 2})
    assert cc._meets(way, {"a", "b"}, {"faults": ["disk_full@"], "tenants": 3})
    assert not cc._meets(way, {"a", "b"}, {"faults": ["kill@redis"], "tenants": 1})
    assert way.describe() == "`a` + one of `b`, `c` + a fault `kill@redis` or `disk_full` + two or more tenants"


def test_summarize_attributes_paths_to_the_scenario_that_ran_them(tmp_path: Path):
    """Record real coverage data of a copy of the engine files under two contexts, then check
    that each scenario gets exactly its own named paths and branches."""
    import coverage

    root = tmp_path / "repo"
    (root / "chaos" / "engine").mkdir(parents=True)
    for rel in cc.ENGINE_FILES.values():
        (root / rel).write_text((cc.ROOT / rel).read_text())
    # A stand-in with the same functions is not needed: run two real lines of each file by
    # compiling tiny probes that carry the engine file's name and line numbers.
    located = cc.resolve_paths(root)
    data_file = tmp_path / ".coverage"
    cov = coverage.Coverage(data_file=str(data_file), branch=True,
                            include=[str(root / rel) for rel in cc.ENGINE_FILES.values()])
    cov.start()
    try:
        for ctx, names in (("clean/one", ["load.local-covers-hit", "store.after-hit"]),
                           ("clean/two", ["retrieve.dropped"])):
            cov.switch_context(ctx)
            for name in names:
                key, line = located[name]
                path = root / cc.ENGINE_FILES[key]
                # A code object whose only line is `line` of that file: executing it records it.
                code = compile("\n" * (line - 1) + "x = 1\n", str(path), "exec")
                exec(code, {})
    finally:
        cov.stop()
        cov.save()
    summary = cc.summarize(data_file, ["one", "two", "three"], root=root,
                           scenario_facts={"one": {"faults": [], "tenants": 1}})
    ran = {n: v["scenarios"] for n, v in summary["named_paths"].items() if v["scenarios"]}
    assert ran == {"load.local-covers-hit": ["one"], "store.after-hit": ["one"], "retrieve.dropped": ["two"]}
    assert summary["reports"]["F8"]["scenarios"] == ["one"]
    assert summary["reports"]["F1"]["scenarios"] == []
    assert summary["figure"]["total"]["branches"] > 100
    assert summary["scenarios"] == ["one", "two", "three"]
    page = cc.render_coverage_md(summary)
    assert "| `load.local-covers-hit` | scheduler.py:" in page
    assert textwrap.dedent("""\
        | F8 | `one` | `load.local-covers-hit` |""") in page


def test_out_of_reach_and_bug_only_paths_are_named_paths():
    known = {p.name for p in cc.NAMED_PATHS}
    assert set(cc.OUT_OF_REACH) <= known and cc.BUG_ONLY_PATHS <= known
    assert not set(cc.OUT_OF_REACH) & cc.BUG_ONLY_PATHS


def test_stored_field_report_map_follows_todays_conditions_and_scenarios():
    """The stored map is what REPORT_PATHS give for today's scenario files (`kvchaos coverage
    docs` re-derives it): a condition naming a fault no scenario has any more is noticed."""
    assert SUMMARY["reports"] == cc.refresh_reports(SUMMARY, cc.scenario_facts_of_catalogue())


def test_a_tier_flush_counts_once_per_tier(tmp_path: Path):
    from kvchaos_support import fault  # noqa: F401  (registers the fault kinds)
    from chaos.scenario.model import Scenario

    s = Scenario.model_validate(
        {"name": "t", "stack": "s.yml", "checks": {"evidence": {}},
         "phases": [{"name": "p", "faults": [{"kind": "tier_flush", "tiers": ["engine", "l1"], "duration": 1},
                                             {"kind": "pause", "service": "redis", "duration": 1}]}]},
        context={"check_paths": False})
    assert cc.scenario_facts_of(s)["faults"] == ["pause@redis", "tier_flush@engine", "tier_flush@l1"]
    way = cc.Requirement(faults=("tier_flush@engine",))
    assert cc._meets(way, set(), cc.scenario_facts_of(s))
    assert not cc._meets(way, set(), {"faults": ["tier_flush@l1"]})
