"""compose/vllm-cpu.yml under ``--backend compose``: the vLLMs in kvchaos/vllm-cpu:latest
(compose/vllm-cpu.Dockerfile, ``make image-vllm``), Redis and LMCache in kvchaos/reference:latest
(``make image``). The smoke scenario must pass there as it does under the local backend: vLLM's
``vllm:external_prefix_cache_hits_total`` grows (the hit phase's trigger) and every output equals
the twin's.

Marked ``vllm`` (tests/vllm/conftest.py: runs only with ``-m vllm``) and ``slow``; about 4 min
here (two vLLM starts in containers). Run by ``make vllm-nightly``, deselected by ``make
vllm-tier``. Skipped, with the reason, without Docker or either image (and, by the conftest,
without the vLLM venv, which ``make vllm-nightly`` sets up).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.stack.compose import docker_client, image_exists

REPO = Path(__file__).resolve().parents[2]
VLLM_IMAGE = os.environ.get("KVCHAOS_VLLM_IMAGE", "kvchaos/vllm-cpu:latest")
IMAGE = os.environ.get("KVCHAOS_IMAGE", "kvchaos/reference:latest")

pytestmark = pytest.mark.slow


def _missing_image() -> str | None:
    try:
        client = docker_client()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the engine is a skip reason
        return f"no Docker engine ({exc}); scripts/docker-setup.sh starts one"
    for image, how in ((VLLM_IMAGE, "make image-vllm"), (IMAGE, "make image")):
        if not image_exists(client, image):
            return f"image {image} is not present: {how}"
    return None


def test_smoke_passes_on_the_vllm_image_under_compose(tmp_path):
    missing = _missing_image()
    if missing:
        pytest.skip(missing)
    reports = tmp_path / "reports"
    env = {**os.environ, "KVCHAOS_STATE_DIR": str(tmp_path / "state"),
           "KVCHAOS_VLLM_IMAGE": VLLM_IMAGE, "KVCHAOS_IMAGE": IMAGE}
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "run", "--backend", "compose",
                        "--stack", str(REPO / "compose" / "vllm-cpu.yml"), "--report-dir", str(reports),
                        str(REPO / "scenarios" / "smoke.yaml")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    [result] = [json.loads(p.read_text()) for p in reports.rglob("result.json")]
    assert result["verdict"] == "passed", result
