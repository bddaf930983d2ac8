"""Every problem is one line, also when the value it quotes holds a newline (a fuzzed shipped
scenario once printed a problem whose quoted value ended the line: the rest, "t)", stood alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.scenario.loader import load_scenario
from chaos.yamlsource import ConfigError


def test_a_quoted_value_with_a_newline_stays_on_its_line(tmp_path: Path) -> None:
    (tmp_path / "s.yml").write_text("services: {}\n")
    path = tmp_path / "s.yaml"
    path.write_text('name: s\nstack: s.yml\nseed: "12\\nt"\nphases: [{name: p}]\nchecks: {liveness: {}}\n')
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    problems = err.value.problems
    assert problems and all("\n" not in p for p in problems), problems
    assert any(p.startswith(f"{path}:3: seed:") and "12\\nt" in p for p in problems), problems
