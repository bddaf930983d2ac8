"""Helpers: write a scenario next to a minimal stack file in a temporary folder."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from .samples import GOOD, STACK  # noqa: F401 - re-exported for the tests


@pytest.fixture
def scenario_dir(tmp_path: Path) -> Path:
    (tmp_path / "stack.yml").write_text(STACK)
    return tmp_path


@pytest.fixture
def write(scenario_dir: Path):
    """write(text, name="s.yaml") -> path of a scenario file next to stack.yml."""

    def _write(text: str, name: str = "s.yaml") -> Path:
        path = scenario_dir / name
        path.write_text(textwrap.dedent(text))
        return path

    return _write
