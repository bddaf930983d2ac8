"""Each planted ``--bug`` really misbehaves, and the clean engine does not (acceptance 7).

Every scenario runs twice, on the clean engine and on the one with the bug, and asserts
``misbehaved == bug planted``: the clean run proves the scenario can pass, the buggy run that
it can fail.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import lmcache_args
from engine_procs import Engine, LMCacheStack, ids, random_prompt, stats

pytestmark = pytest.mark.slow

PLANTED = [False, True]


@pytest.fixture(scope="module")
def fragile_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LMCacheStack]:
    """A stack of our own, because these tests pause the LMCache server or leak sessions."""
    stack = LMCacheStack(tmp_path_factory.mktemp("fragile"))
    stack.start()
    yield stack
    stack.stop()


def bug_args(bug: str, planted: bool) -> list[str]:
    return ["--bug", bug] if planted else []


def stream_and_disconnect(engine: Engine, prompt: list[int], request_id: str) -> None:
    body = {"prompt": prompt, "max_tokens": 3000, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=engine.base, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body,
                           headers={"X-Request-Id": request_id}) as resp:
            for n, line in enumerate(resp.iter_lines()):
                if n >= 4:
                    break


@pytest.mark.parametrize("planted", PLANTED)
def test_trust_failed_load(planted: bool, make_engine, twin: Engine,
                           fragile_stack: LMCacheStack) -> None:
    """F3: LMCache stops answering between lookup and retrieve; the load fails."""
    eng = make_engine("trust", [*bug_args("trust-failed-load", planted),
                                *lmcache_args(fragile_stack, mq_timeout=1.0)])
    p = random_prompt(600 + planted, 1100)
    eng.complete(p, 2)
    eng.client.post("/hooks/stall", json={"point": "before_retrieve", "seconds": 2.5})
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(eng.complete(p, 24, ignore_eos=True)))
    t.start()
    time.sleep(1.0)  # lookup done (a hit), scheduler held before the retrieve
    fragile_stack.server.signal(signal.SIGSTOP)
    try:
        time.sleep(5.0)
    finally:
        fragile_stack.server.signal(signal.SIGCONT)
    t.join(timeout=60)
    assert stats(result)["lookup"] == "hit"
    assert stats(result)["load_failed_tokens"] == 1024
    assert eng.metric("kvchaos_engine_load_failures_total") == 1
    misbehaved = ids(result) != ids(twin.complete(p, 24, ignore_eos=True))
    assert misbehaved == planted


@pytest.mark.parametrize("planted", PLANTED)
def test_skip_abort_cleanup(planted: bool, make_engine, fragile_stack: LMCacheStack) -> None:
    """F9: a client disconnect after a hit must end the LMCache session."""
    eng = make_engine("abort", [*bug_args("skip-abort-cleanup", planted),
                                *lmcache_args(fragile_stack)])
    p = random_prompt(700 + planted, 1100)
    eng.complete(p, 2)
    time.sleep(0.3)
    before = fragile_stack.status()["active_sessions"]
    stream_and_disconnect(eng, p, f"leak-{planted}")
    time.sleep(3.0)
    leaked = fragile_stack.status()["active_sessions"] - before
    assert eng.metric("kvchaos_engine_aborts_total") == 1
    assert eng.state()["blocks_held_by_requests"] == 0
    assert (leaked > 0) == planted


@pytest.mark.parametrize("bug", ["hit-plus-one-token", "hit-plus-one-chunk"])
@pytest.mark.parametrize("planted", PLANTED)
def test_hit_longer_than_loaded(bug: str, planted: bool, make_engine, twin: Engine,
                                lmcache_stack: LMCacheStack) -> None:
    """F1/F2: the reported (and skipped) hit is longer than what LMCache loaded."""
    eng = make_engine("offby", [*bug_args(bug, planted), *lmcache_args(lmcache_stack)])
    p = random_prompt(800 + planted + 10 * len(bug), 1100)
    eng.complete(p, 2)
    r = eng.complete(p, 24, ignore_eos=True)
    reported = stats(r)["external_cache_hit_tokens"]
    expected_len = {"hit-plus-one-token": 1025, "hit-plus-one-chunk": 1099}[bug]
    assert reported == (expected_len if planted else 1024)
    misbehaved = ids(r) != ids(twin.complete(p, 24, ignore_eos=True))
    assert misbehaved == planted


@pytest.mark.parametrize("planted", PLANTED)
def test_drop_cache_salt(planted: bool, make_engine, twin: Engine,
                         lmcache_stack: LMCacheStack) -> None:
    """F12: tenant B must never hit tenant A's KV (salts differ)."""
    eng = make_engine("salt", [*bug_args("drop-cache-salt", planted),
                               *lmcache_args(lmcache_stack)])
    p = random_prompt(900 + planted, 700)
    a = eng.complete(p, 8, cache_salt="tenant-a")
    b = eng.complete(p, 8, cache_salt="tenant-b")
    a2 = eng.complete(p, 8, cache_salt="tenant-a")
    assert stats(a2)["external_cache_hit_tokens"] == 512  # same tenant does hit
    cross = stats(b)["external_cache_hit_tokens"]
    assert ids(a) == ids(b) == ids(twin.complete(p, 8))
    assert (cross > 0) == planted


@pytest.mark.parametrize("planted", PLANTED)
def test_store_before_compute(planted: bool, make_engine, twin: Engine,
                              lmcache_stack: LMCacheStack) -> None:
    """A chunk stored before its KV exists poisons the next request's hit."""
    eng = make_engine("early", [*bug_args("store-before-compute", planted),
                                *lmcache_args(lmcache_stack)])
    p = random_prompt(1000 + planted, 1100)
    first = eng.complete(p, 24, ignore_eos=True)
    second = eng.complete(p, 24, ignore_eos=True)
    ref = ids(twin.complete(p, 24, ignore_eos=True))
    assert ids(first) == ref  # the storing request itself computes correctly
    assert stats(second)["external_cache_hit_tokens"] == 1024
    assert (ids(second) != ref) == planted


@pytest.mark.parametrize("planted", PLANTED)
def test_stale_blocks_on_resume(planted: bool, make_engine, twin: Engine) -> None:
    """F10: a preempted request resumes on blocks other requests have overwritten."""
    eng = make_engine("stale", ["--num-blocks", "80",
                                *bug_args("stale-blocks-on-resume", planted)])
    prompts = [random_prompt(1100 + i, 600) for i in range(4)]
    results: dict[int, dict] = {}

    def send(i: int) -> None:
        results[i] = eng.complete(prompts[i], 48, ignore_eos=True)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert eng.metric("vllm:num_preemptions_total") > 0
    misbehaved = any(ids(results[i]) != ids(twin.complete(prompts[i], 48, ignore_eos=True))
                     for i in range(4))
    assert misbehaved == planted
