"""The layers of chaos/ as import-linter contracts (pyproject.toml ``[tool.importlinter]``,
docs/architecture.md "Layers"): kept by the repository, broken by a planted cycle or upward import.

Every test runs ``lint-imports`` (import-linter's command, Python API in a subprocess so that
the package it analyses is the one in its working directory) on the repository, or on a copy
of chaos/ and pyproject.toml in tmp_path with one import added; the repository is never edited.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(no_cache=True, no_logo=True))")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the pyproject.toml in ``root`` on the chaos/ package in ``root``."""
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})


def copy_of_package(tmp_path: Path) -> Path:
    """chaos/ and pyproject.toml copied into ``tmp_path`` (no byte code)."""
    shutil.copytree(ROOT / "chaos", tmp_path / "chaos", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def plant(root: Path, module: str, line: str) -> None:
    """Append ``line`` (an import, at module level or in a function) to chaos/``module``."""
    path = root / "chaos" / module
    path.write_text(path.read_text() + "\n\n" + line + "\n")


def test_the_repository_keeps_every_contract() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " kept, 0 broken." in done.stdout, done.stdout


def test_the_copy_keeps_them_too(tmp_path: Path) -> None:
    """The copy alone (no plant) passes: a broken contract below comes from the plant."""
    done = lint_imports(copy_of_package(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("module, line, importer, imported", [
    # history is the bottom layer, cli the top: a module-level import up
    ("history.py", "import chaos.cli  # noqa", "chaos.history", "chaos.cli"),
    # the runner is handed the diagnosis hook; a deferred (function-level) import up counts too
    ("runner/suite.py", "def _diagnose():\n    from chaos.diagnose.hook import diagnose_after_checks\n",
     "chaos.runner.suite", "chaos.diagnose.hook"),
])
def test_an_upward_import_breaks_the_layers(tmp_path: Path, module: str, line: str, importer: str,
                                             imported: str) -> None:
    root = copy_of_package(tmp_path)
    plant(root, module, line)
    done = lint_imports(root)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "chaos/ imports downwards only BROKEN" in done.stdout, done.stdout
    assert f"{importer} -> {imported}" in done.stdout, done.stdout


def test_a_cycle_between_layers_breaks_layers_and_acyclic(tmp_path: Path) -> None:
    """journal imports procid; procid importing journal closes a circle."""
    root = copy_of_package(tmp_path)
    plant(root, "procid.py", "def _journal():\n    from chaos.journal import Journal\n")
    done = lint_imports(root)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "chaos/ imports downwards only BROKEN" in done.stdout, done.stdout
    assert "own package) BROKEN" in done.stdout, done.stdout  # the acyclic contract's name, wrapped
    assert "No cycles are allowed in chaos." in done.stdout, done.stdout


def test_a_cycle_inside_a_package_breaks_acyclic(tmp_path: Path) -> None:
    """Inside chaos/stack (which the layers contract does not order), base imports spec; spec
    importing base back is a cycle only the acyclic contract sees."""
    root = copy_of_package(tmp_path)
    plant(root, "stack/spec.py", "def _stack():\n    from chaos.stack.base import Stack\n")
    done = lint_imports(root)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "chaos/ imports downwards only KEPT" in done.stdout, done.stdout
    assert "No cycles are allowed in chaos.stack." in done.stdout, done.stdout


def test_the_proxy_keeps_its_circle(tmp_path: Path) -> None:
    """chaos/proxy mirrors Toxiproxy's package, whose modules import each other; a cycle there
    is allowed (skip_descendants). The plant closes one: server imports errors."""
    root = copy_of_package(tmp_path)
    plant(root, "proxy/errors.py", "def _server():\n    from chaos.proxy import server\n")
    done = lint_imports(root)
    assert done.returncode == 0, done.stdout + done.stderr
