"""Scenario discovery skips stack files kept next to scenarios (they are not scenarios)."""

from pathlib import Path

from chaos.scenario.loader import discover_scenarios, is_stack_file

DATA = Path(__file__).resolve().parents[1] / "runner" / "data"


def test_stack_files_are_not_scenarios():
    found = {p.name for p in discover_scenarios(DATA)}
    assert "hold-latency.yaml" in found and "idle-link.yaml" in found
    assert "proxy-redis.yml" not in found and "proxy-redis-idle.yml" not in found
    assert is_stack_file(DATA / "proxy-redis.yml")
    assert not is_stack_file(DATA / "hold-latency.yaml")


def test_broken_yaml_counts_as_a_scenario_so_its_error_is_reported(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("services: [\n")
    assert not is_stack_file(bad)
    assert discover_scenarios(tmp_path) == [bad]


def test_a_folders_own_scenarios_come_before_its_sub_folders(tmp_path):
    """The catalogue runs first, then scenarios/findings/ (reproducers of upstream bugs)."""
    (tmp_path / "findings").mkdir()
    for rel in ("zeta.yaml", "alpha.yaml", "findings/aaa.yaml", "findings/b.yml"):
        (tmp_path / rel).write_text("name: x\n")
    got = [p.relative_to(tmp_path).as_posix() for p in discover_scenarios(tmp_path)]
    assert got == ["alpha.yaml", "zeta.yaml", "findings/aaa.yaml", "findings/b.yml"]
