"""Acceptance 1-4 against the real `lmcache server` (Redis + fs L2) and the recompute twin."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from engine_procs import Engine, LMCacheStack, ids, lmcache_args, random_prompt, stats

pytestmark = pytest.mark.slow


def test_repeated_1100_token_prompt_is_an_lmcache_hit(engine: Engine, twin: Engine,
                                                       lmcache_stack: LMCacheStack) -> None:
    p = random_prompt("e2e:1100", 1100)
    first = engine.complete(p, 16, logprobs=1)
    second = engine.complete(p, 16, logprobs=1)
    ref = twin.complete(p, 16, logprobs=1)
    assert stats(first)["lookup"] == "miss"
    assert stats(second)["lookup"] == "hit"
    assert stats(second)["external_cache_hit_tokens"] >= 1024
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 1024
    assert lmcache_stack.l1()["total_object_count"] > 0
    assert lmcache_stack.redis_keys() > 0
    assert ids(first) == ids(ref) and ids(second) == ids(ref)
    # Bit-exact, not merely the same argmax.
    lp = second["choices"][0]["logprobs"]["token_logprobs"]
    assert lp == ref["choices"][0]["logprobs"]["token_logprobs"]
    assert engine.metric("vllm:external_prefix_cache_hits_total") >= 1024


@pytest.mark.parametrize("n", [255, 256, 257, 511, 512, 513])
def test_chunk_boundaries_equal_recompute(engine: Engine, twin: Engine, n: int) -> None:
    p = random_prompt(f"e2e:{20_000 + n}", n)
    ref = ids(twin.complete(p, 12, ignore_eos=True))
    first = engine.complete(p, 12, ignore_eos=True)
    second = engine.complete(p, 12, ignore_eos=True)
    assert ids(first) == ref and ids(second) == ref
    # The last prompt token is always computed: n = 256 or 512 loads one chunk less.
    assert stats(second)["external_cache_hit_tokens"] == ((n - 1) // 256) * 256


def test_local_prefix_cache_and_lmcache_together(engine: Engine, twin: Engine,
                                                 make_engine, lmcache_stack: LMCacheStack
                                                 ) -> None:
    """F1: local APC covers part of the prefix, LMCache the rest; output equals recompute."""
    p = random_prompt("e2e:3000", 1100)
    engine.complete(p, 4)  # stores 1024 tokens in LMCache
    apc = make_engine("apc", ["--enable-prefix-caching", *lmcache_args(lmcache_stack)])
    short = p[:600] + random_prompt("e2e:3001", 50)
    r1 = apc.complete(short, 8, ignore_eos=True)
    assert stats(r1)["external_cache_hit_tokens"] == 512
    r2 = apc.complete(p, 12, ignore_eos=True)
    assert stats(r2)["local_cache_hit_tokens"] == 512
    assert stats(r2)["external_cache_hit_tokens"] == 512
    assert ids(r1) == ids(twin.complete(short, 8, ignore_eos=True))
    assert ids(r2) == ids(twin.complete(p, 12, ignore_eos=True))
    time.sleep(0.5)
    assert lmcache_stack.l1()["read_locked_count"] == 0
    assert lmcache_stack.status()["active_sessions"] == 0


def test_preemption_equals_recompute(make_engine, twin: Engine,
                                     lmcache_stack: LMCacheStack) -> None:
    """A pool too small for 8 concurrent 600-token requests preempts; outputs are exact."""
    small = make_engine("preempt", ["--num-blocks", "80", *lmcache_args(lmcache_stack)])
    prompts = [random_prompt(f"e2e:{4000 + i}", 600) for i in range(8)]
    results: dict[int, dict] = {}

    def send(i: int) -> None:
        results[i] = small.complete(prompts[i], 48, ignore_eos=True)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert len(results) == 8
    assert small.metric("vllm:num_preemptions_total") > 0
    assert small.metric("kvchaos_engine_replay_mismatches_total") == 0
    for i in range(8):
        assert ids(results[i]) == ids(twin.complete(prompts[i], 48, ignore_eos=True)), i
    assert small.state()["blocks_held_by_requests"] == 0


def test_client_disconnect_after_hit_releases_everything(engine: Engine,
                                                         lmcache_stack: LMCacheStack) -> None:
    p = random_prompt("e2e:5000", 1100)
    engine.complete(p, 2)  # warm LMCache
    aborts_before = engine.metric("kvchaos_engine_aborts_total")
    body = {"prompt": p, "max_tokens": 3000, "stream": True, "ignore_eos": True}
    got = 0
    with httpx.Client(base_url=engine.base, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body,
                           headers={"X-Request-Id": "cancel-me"}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    got += 1
                    if got == 3:
                        break
    assert got == 3
    deadline = time.monotonic() + 5
    while True:
        st, l1 = lmcache_stack.status(), lmcache_stack.l1()
        state = engine.state()
        clean = (l1["read_locked_count"] == 0 and st["active_sessions"] == 0
                 and "cancel-me" not in state["requests"]
                 and state["blocks_held_by_requests"] == 0 and state["num_open_sessions"] == 0)
        if clean or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert clean, (st["active_sessions"], l1, state)
    assert engine.metric("kvchaos_engine_aborts_total") == aborts_before + 1


def test_the_heartbeat_gauge_counts_the_adapters_whose_heartbeat_runs(make_engine,
                                                                       lmcache_stack: LMCacheStack) -> None:
    """LMCache starts an adapter's heartbeat with its first lookup (scheduler) or store
    (worker); until then a restart of the server cannot be seen, and chaos/stack/reconnect.py
    does not wait for the engine to notice one (``kvchaos_engine_lmcache_heartbeats`` 0)."""
    eng = make_engine("heartbeats", ["--num-blocks", "200", *lmcache_args(lmcache_stack)])
    assert eng.metric("kvchaos_engine_lmcache_healthy") == 1
    assert eng.metric("kvchaos_engine_lmcache_heartbeats") == 0
    eng.complete(random_prompt("e2e:heartbeats", 600), 2)  # a lookup, then a store of one chunk
    deadline = time.monotonic() + 5  # the gauges are set on the engine's next step
    while eng.metric("kvchaos_engine_lmcache_heartbeats") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert eng.metric("kvchaos_engine_lmcache_heartbeats") == 2
