"""compose/reference.yml under the compose backend: every service in a container of the kvchaos
image, the proxy in the real Toxiproxy's image (kvchaos/toxiproxy, built offline from
../shared/tools/toxiproxy) when it is present or buildable, else kvchaos's own proxy in the
kvchaos image.

Needs the image (about 2.5-5 min to build, see compose/README.md); skipped with the reason when
it is not present.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from chaos.stack.compose import TOXIPROXY_IMAGE, ComposeStack, image_exists

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("KVCHAOS_IMAGE", "kvchaos/reference:latest")

pytestmark = pytest.mark.slow


@pytest.fixture
def reference_stack(docker, monkeypatch, tmp_path, sweeper) -> ComposeStack:
    if not image_exists(docker, IMAGE):
        msg = f"image {IMAGE} is not present: build it with scripts/build-image.sh"
        if os.environ.get("CI"):  # CI builds it; a skip there would hide the compose backend
            pytest.fail(msg)
        pytest.skip(msg)
    monkeypatch.setenv("KVCHAOS_STATE_DIR", str(tmp_path / "state"))
    stack = ComposeStack(REPO / "compose" / "reference.yml", run_dir=tmp_path / "run",
                         environ={**os.environ, "KVCHAOS_IMAGE": IMAGE})
    sweeper.append(stack.project)
    return stack


def complete(url: str, prompt: str) -> dict:
    r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8}, timeout=120)
    r.raise_for_status()
    return r.json()


def test_reference_stack_serves_through_the_proxy_and_survives_an_lmcache_kill(reference_stack, docker, leftovers):
    stack = reference_stack
    prompt = "kvchaos compose " * 80
    with stack:
        st = stack.status()
        assert all(s.state == "running" and s.healthy for s in st.values()), st
        # unset KVCHAOS_PROXY: the real Toxiproxy when its image is there (built from the binary
        # if need be), kvchaos's proxy in the kvchaos image otherwise
        real = os.environ.get("KVCHAOS_PROXY") != "bundled" and image_exists(docker, TOXIPROXY_IMAGE)
        assert st["toxiproxy"].detail["image"] == (TOXIPROXY_IMAGE if real else IMAGE)
        proxies = httpx.get(stack.settings.proxy.api + "/proxies", timeout=10).json()
        assert set(proxies) == {"engine-lmcache", "lmcache-redis"}

        expected = complete(stack.settings.recompute_url, prompt)["choices"][0]["token_ids"]
        assert complete(stack.settings.engine_url, prompt)["choices"][0]["token_ids"] == expected

        stack.kill("lmcache")
        assert stack.status()["lmcache"].state == "exited"
        stack.start("lmcache")
        after = complete(stack.settings.engine_url, "other family " * 80)
        assert after["choices"][0]["token_ids"] == complete(
            stack.settings.recompute_url, "other family " * 80)["choices"][0]["token_ids"]
        assert stack.unexpected_exits() == []
    assert leftovers(stack.project) == {"containers": [], "networks": [], "volumes": []}
    assert (stack.run_dir / "logs" / "lmcache.log").read_text()
