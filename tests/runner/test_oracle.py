"""The recompute oracle against a real recompute twin (the reference engine, cache off)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from chaos.history import HistoryWriter
from chaos.oracle import RecomputeOracle, engine_fingerprint, request_key
from chaos.stack.environment import service_environment
from chaos.stack.spec import free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def twin():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "chaos.engine", "serve", "--port", str(port),
                             "--kv-connector", "none", "--num-layers", "2", "--hidden-size", "128",
                             "--num-heads", "4", "--num-kv-heads", "2", "--intermediate-size", "256"],
                            env=service_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("the twin did not start")
    yield url
    proc.terminate()
    proc.wait(30)


def completed(prompts: list[list[int]], max_tokens: int = 4):
    h = HistoryWriter(None)
    for i, p in enumerate(prompts):
        h.append("client-0", "invoke", "complete", request_id=f"r{i}",
                 value={"prompt_token_ids": p, "max_tokens": max_tokens})
        h.append("client-0", "ok", "complete", request_id=f"r{i}", value={"token_ids": []})
    h.append("client-0", "invoke", "complete", request_id="never", value={"prompt_token_ids": [1], "max_tokens": 1})
    return h.ops


def test_asks_once_then_reads_back(twin, tmp_path):
    prompts = [[65 + i] * 40 for i in range(3)] + [[65] * 40]  # the last repeats the first
    folder = tmp_path / "not" / "yet" / "there"  # created on demand (was: sqlite "unable to open")
    first = RecomputeOracle(twin, directory=folder)
    expected = first.expected_for(completed(prompts))
    assert set(expected) == {"r0", "r1", "r2", "r3"}  # no expectation for a request that never completed
    assert first.misses == 3 and first.hits == 0
    assert expected["r0"] == expected["r3"]
    direct = httpx.post(f"{twin}/v1/completions", json={"prompt": prompts[1], "max_tokens": 4}, timeout=60).json()
    assert expected["r1"] == direct["choices"][0]["token_ids"]

    again = RecomputeOracle(twin, directory=folder)
    assert again.expected_for(completed(prompts)) == expected
    assert again.misses == 0 and again.hits == 4
    assert again.path.name == f"{engine_fingerprint(twin)}.sqlite"


def test_key_depends_on_prompt_and_max_tokens():
    assert request_key([1, 2], 4) != request_key([1, 2], 5)
    assert request_key([1, 2], 4) != request_key([2, 1], 4)
    assert request_key([1, 2], 4) == request_key([1, 2], 4)


def test_key_covers_the_sampling_parameters(monkeypatch):
    """Answers stored before `ignore_eos` was sent (outputs cut at EOS) must not be reused:
    that gave false recompute failures (a 28-token answer against a 32-token output)."""
    from chaos.workload import client

    before = request_key([1, 2], 4)
    monkeypatch.setitem(client.SAMPLING, "ignore_eos", False)
    assert request_key([1, 2], 4) != before
