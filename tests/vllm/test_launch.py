"""chaos/vllm/launch.py in the vLLM venv: the "+cpu" version answer and the planted-bug hook
(an unknown name is refused, with exit 2 before vLLM starts; the bugs: tests/vllm/test_bugs.py)."""

from __future__ import annotations

import subprocess

from chaos.vllm.cli import installed_version, vllm_python


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([str(vllm_python()), "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_vllm_version_is_answered_with_the_cpu_suffix():
    r = _run("import chaos.vllm.launch, importlib.metadata as m; print(m.version('vllm'))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == installed_version(vllm_python()) + "+cpu"


def test_vllm_detects_the_cpu_platform_through_the_launcher():
    r = _run("import chaos.vllm.launch; from vllm.platforms import current_platform as p; print(p.device_type)")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "cpu"


def test_unknown_bug_from_the_environment_is_refused_at_import():
    r = _run("import chaos.vllm.launch", env={"KVCHAOS_VLLM_BUGS": "no-such-bug"})
    assert r.returncode == 2
    assert "unknown bug no-such-bug" in r.stderr


def test_bug_option_is_taken_out_of_vllms_arguments():
    r = _run("from chaos.vllm.launch import _split_bugs; "
             "print(_split_bugs(['serve', 'M', '--bug', 'a', '--port', '1', '--bug=b']))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(['a', 'b'], ['serve', 'M', '--port', '1'])"
