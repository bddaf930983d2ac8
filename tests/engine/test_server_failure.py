"""LMCache stalls, dies and comes back (acceptance 5, failure policy; F4, F5, F7, F11)."""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from engine_procs import SMALL_MODEL, Engine, LMCacheStack, ids, lmcache_args, random_prompt, stats

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def killable_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LMCacheStack]:
    """One stack for the module's tests, which may stop, kill and restart its server (a stack
    per test spent most of each test starting LMCache). Only Redis is started here: the first
    test, test_engine_starts_before_lmcache_and_connects_later, starts the server itself after
    its engine, and ``own_stack`` starts it for any other test that finds it not running."""
    stack = LMCacheStack(tmp_path_factory.mktemp("killable"))
    stack.redis.start()
    yield stack
    stack.redis.signal(signal.SIGCONT)
    stack.server.signal(signal.SIGCONT)
    stack.stop()


def _left_clean(stack: LMCacheStack) -> bool:
    """The server runs and answers with no read lock and no session left."""
    if not stack.server.alive():
        return False
    try:
        return stack.l1()["read_locked_count"] == 0 and stack.status()["active_sessions"] == 0
    except (httpx.HTTPError, KeyError, ValueError):
        return False


@pytest.fixture()
def own_stack(killable_stack: LMCacheStack, request: pytest.FixtureRequest) -> Iterator[LMCacheStack]:
    """The module's stack, handed over as a stack of the test's own would be: both processes
    resumed, the server running with no read lock and no session (else started, or restarted:
    an earlier test that failed may have left them), and its log started afresh (tests read it; what the
    earlier tests logged is kept beside it, ``lmcache.log.<test>``). What the tiers store stays:
    every test uses prompts of its own seeds, so none hits another's chunks."""
    stack = killable_stack
    stack.redis.signal(signal.SIGCONT)
    stack.server.signal(signal.SIGCONT)
    if not _left_clean(stack):
        stack.server.kill()
        stack.start_server()
    log = stack.server.log_path
    if log.exists():  # the server appends (O_APPEND): it writes on from the new start
        shutil.copyfile(log, log.with_name(f"{log.name}.before-{request.node.name}"))
        log.write_bytes(b"")
    yield stack
    stack.redis.signal(signal.SIGCONT)
    stack.server.signal(signal.SIGCONT)


def wait_clean(stack: LMCacheStack, timeout_s: float) -> tuple[int, int]:
    """Wait until LMCache holds no read locks and no sessions; return the last values."""
    deadline = time.monotonic() + timeout_s
    while True:
        locks, sessions = stack.l1()["read_locked_count"], stack.status()["active_sessions"]
        if (locks == 0 and sessions == 0) or time.monotonic() > deadline:
            return locks, sessions
        time.sleep(0.2)


@pytest.fixture(scope="module")
def early_bird(killable_stack: LMCacheStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The engine of the module's first two tests, started before its LMCache server when the
    module starts with test_engine_starts_before_lmcache_and_connects_later (as it does); an
    engine of its own for test_server_killed_mid_run_then_restarted, the next, cost a start
    (7 CPU-seconds)."""
    eng = Engine("early-bird", tmp_path_factory.mktemp("early-bird"),
                 [*SMALL_MODEL, *lmcache_args(killable_stack)]).start(wait_lmcache=False)
    yield eng
    eng.stop()


def test_engine_starts_before_lmcache_and_connects_later(early_bird: Engine, killable_stack: LMCacheStack) -> None:
    """The engine starts while its LMCache server does not run yet (the module's stack, whose
    server this test, the module's first, starts)."""
    stack, eng = killable_stack, early_bird
    assert not stack.server.alive() and eng.state()["lmcache"]["state"] == "connecting", \
        "run first in the module: its engine must start before the LMCache server"
    r = eng.complete([5] * 300, 2)
    assert stats(r)["lookup"] == "error"
    stack.start_server()
    eng.wait_lmcache("healthy", 30)
    eng.complete([6] * 300, 2)
    assert stats(eng.complete([6] * 300, 2))["external_cache_hit_tokens"] == 256


def test_server_killed_mid_run_then_restarted(early_bird: Engine, twin: Engine,
                                              own_stack: LMCacheStack) -> None:
    eng = early_bird
    eng.wait_lmcache("healthy", 60)
    prompts = [random_prompt(f"fail:{7000 + i}", 600) for i in range(4)]
    for p in prompts:
        eng.complete(p, 2)  # stored: the run below starts with hits
    results: list[dict] = []
    errors: list[str] = []

    def client() -> None:
        for k in range(12):
            try:
                results.append(eng.complete(prompts[k % 4], 16, ignore_eos=True))
            except AssertionError as exc:  # HTTP error
                errors.append(str(exc))

    # Hold the first lookup 2 s in the scheduler, so that it is sent after the kill however
    # fast the 12 requests would otherwise run.
    eng.client.post("/hooks/stall", json={"point": "before_lookup", "seconds": 2.0})
    t = threading.Thread(target=client)
    t.start()
    time.sleep(0.5)
    own_stack.server.kill()  # SIGKILL mid-run
    t.join(timeout=180)
    assert not errors and len(results) == 12
    for k, r in enumerate(results):
        assert ids(r) == ids(twin.complete(prompts[k % 4], 16, ignore_eos=True)), k
    assert any(stats(r)["lookup"] in ("timeout", "error") for r in results), [stats(r) for r in results]
    assert eng.client.get("/health").status_code == 200
    # The server comes back on the same port: hits must come back within a bound (F11).
    own_stack.start_server()
    q = random_prompt("fail:7100", 600)
    deadline = time.monotonic() + 30
    hit = 0
    while time.monotonic() < deadline and hit == 0:
        r = eng.complete(q, 4)
        hit = stats(r)["external_cache_hit_tokens"]
        time.sleep(0.5)
    assert hit == 512, eng.state()["lmcache"]
    assert ids(r) == ids(twin.complete(q, 4))
    assert wait_clean(own_stack, 10) == (0, 0)


def test_lookup_timeout_falls_back_to_recompute(make_engine, twin: Engine,
                                                own_stack: LMCacheStack) -> None:
    """F5: the server stops answering; the lookup times out; the output is still exact."""
    eng = make_engine("stalled", lmcache_args(own_stack, mq_timeout=1.0, heartbeat=5.0))
    p = random_prompt("fail:7200", 700)
    eng.complete(p, 2)
    own_stack.server.signal(signal.SIGSTOP)
    try:
        r = eng.complete(p, 16, ignore_eos=True)
    finally:
        own_stack.server.signal(signal.SIGCONT)
    assert stats(r)["lookup"] == "timeout"
    assert stats(r)["external_cache_hit_tokens"] == 0
    assert eng.metric("kvchaos_engine_lookup_timeouts_total") == 1
    assert ids(r) == ids(twin.complete(p, 16, ignore_eos=True))
    # Health comes back; so do hits; nothing stays locked.
    eng.wait_lmcache("healthy", 30)
    assert stats(eng.complete(p, 4))["external_cache_hit_tokens"] == 512
    assert wait_clean(own_stack, 10) == (0, 0)
    assert eng.state()["num_open_sessions"] == 0


def test_failed_load_with_policy_fail_is_a_500(make_engine, own_stack: LMCacheStack) -> None:
    eng = make_engine("failer", ["--kv-load-failure-policy", "fail",
                                 *lmcache_args(own_stack, mq_timeout=1.0)])
    p = random_prompt("fail:7300", 1100)
    eng.complete(p, 2)
    eng.client.post("/hooks/stall", json={"point": "before_retrieve", "seconds": 2.5})
    result: dict = {}

    def send() -> None:
        resp = eng.client.post("/v1/completions", json={"prompt": p, "max_tokens": 8})
        result.update(status=resp.status_code, body=resp.json())

    t = threading.Thread(target=send)
    t.start()
    time.sleep(1.0)
    own_stack.server.signal(signal.SIGSTOP)
    try:  # frozen until the retrieve has timed out (the engine counts the failed load), no longer
        deadline = time.monotonic() + 30
        while eng.metric("kvchaos_engine_load_failures_total") < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        own_stack.server.signal(signal.SIGCONT)
    t.join(timeout=60)
    assert result["status"] == 500, result
    assert result["body"]["object"] == "error"
    assert "kv_load_failure_policy=fail" in result["body"]["message"]
    assert eng.metric("kvchaos_engine_load_failures_total") == 1
    assert eng.state()["blocks_held_by_requests"] == 0
    assert len(ids(eng.complete([1, 2, 3], 2))) >= 1  # still serving
    # The frozen server still had the timed-out retrieve queued and handled it once resumed: the
    # engine's FREE and END_SESSION must follow it (tests/engine/test_connector_late_transfers.py),
    # or the retrieve releases the locks a second time and makes the ended session again.
    assert wait_clean(own_stack, 15) == (0, 0), [
        line for line in own_stack.server.tail(400).splitlines() if "session" in line.lower()]
    assert "finish read on non-read-locked key" not in own_stack.server.tail(2000)


def test_restart_during_lookups_leaves_no_session(make_engine, twin: Engine,
                                                  own_stack: LMCacheStack) -> None:
    """Lookups in flight die with the server; the restarted server must not inherit a session.

    The server is frozen (SIGSTOP) so that the LOOKUPs sent to it are never acknowledged, then
    SIGKILLed (they die in its socket buffer) and restarted. The heartbeat notices the outage
    before the LOOKUP acknowledgement times out, so the adapter keeps the dead LOOKUP's ack
    pending. The clean-ups kept during the outage must not replay FREE_LOOKUP_LOCKS onto the
    new server (it creates a session there) and then lose END_SESSION to the stale ack.
    """
    eng = make_engine("restarted", lmcache_args(own_stack, mq_timeout=4.0, heartbeat=0.5))
    prompts = [random_prompt(f"fail:7400:{i}", 600) for i in range(3)]
    for p in prompts:
        eng.complete(p, 2)  # stored: the lookups below would hit
    results: dict[int, dict] = {}
    errors: list[str] = []

    def client(k: int) -> None:
        try:
            results[k] = eng.complete(prompts[k], 24, ignore_eos=True)
        except AssertionError as exc:  # HTTP error
            errors.append(str(exc))

    own_stack.server.signal(signal.SIGSTOP)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(len(prompts))]
    for t in threads:
        t.start()
    eng.wait_lmcache("unhealthy", 10)
    own_stack.server.kill()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 3
    assert all(stats(r)["lookup"] in ("timeout", "error") for r in results.values())
    for k, p in enumerate(prompts):
        assert ids(results[k]) == ids(twin.complete(p, 24, ignore_eos=True)), k
    own_stack.start_server()
    eng.wait_lmcache("healthy", 30)
    # The engine finishes its kept clean-ups (a lost LOOKUP is given up after mq_timeout)...
    deadline = time.monotonic() + 15
    while eng.state()["num_open_sessions"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert eng.state()["num_open_sessions"] == 0
    # ...and the new server is left with no session and no lock of it.
    assert wait_clean(own_stack, 3) == (0, 0), [
        line for line in own_stack.server.tail(400).splitlines() if "session" in line.lower()]
    # The engine uses the new server again: store, then hit.
    q = random_prompt("fail:7401", 600)
    eng.complete(q, 2)
    assert stats(eng.complete(q, 2))["external_cache_hit_tokens"] == 512
    assert wait_clean(own_stack, 8) == (0, 0)



def test_lookup_handled_late_is_freed_after_its_prefetch(make_engine, twin: Engine,
                                                         own_stack: LMCacheStack) -> None:
    """A LOOKUP the adapter gave up on is handled by the server later; the engine's kept lock
    free must wait for the prefetch it starts, or LMCache releases nothing and the finished
    prefetch keeps its chunks read-locked.

    Input: scenarios/lmcache-restart.yaml, 1 run in 15 (the LOOKUPs waited in the message
    queue's pipe for the restarted server; tests/engine/test_connector_late_lookups.py has the
    story). Here the same order is made certain: the server runs with an empty L1 (restarted
    after the prefix was stored in L2), it is frozen when the LOOKUP is sent, and Redis (an L2
    tier holding the chunks) is frozen too, so that once the server runs again the LOOKUP's
    prefetch waits for Redis while the engine's free is due. Redis resumes 1.5 s after the
    engine sees the server healthy again, inside the engine's wait (mq_timeout, 4 s).
    """
    eng = make_engine("late-lookup", lmcache_args(own_stack, mq_timeout=4.0, heartbeat=1.0))
    # The window is the LOOKUP reaching the thawed server; it may instead be lost with the
    # connection the adapter gave up on (CI of 6c53b2e, loaded stage 2: no prefetch was ever
    # logged, nothing was locked). Such a try proves nothing either way: try again, a new
    # prefix each time, and judge the first try that reached the window.
    for attempt in range(3):
        log = _late_lookup_try(eng, twin, own_stack, random_prompt(f"fail:7500:{attempt}" if attempt else "fail:7500",
                                                                   1100))
        if any("Prefetch request completed" in line for line in log):  # the late LOOKUP's
            break
    else:
        pytest.skip("window not reached in 3 tries: the late LOOKUP was lost with the old connection each time "
                    f"(the last server log: {log})")
    assert not any("while its prefetch is still running" in line for line in log), log


def _late_lookup_try(eng: Engine, twin: Engine, own_stack: LMCacheStack, p: list[int]) -> list[str]:
    """One try of test_lookup_handled_late_is_freed_after_its_prefetch with prompt ``p``: the
    server's ``free_lookup_locks`` and ``Prefetch`` lines since its restart in this try. Asserts
    on the way that the request timed out its LOOKUP and was right, and that the engine and
    LMCache end with no session and no read lock (true whether or not the window was reached)."""
    keys = own_stack.redis_keys()
    eng.complete(p, 2)  # 4 chunks stored in L1, Redis and the filesystem tier
    deadline = time.monotonic() + 20
    while own_stack.redis_keys() < keys + 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert own_stack.redis_keys() >= keys + 4
    own_stack.server.kill()
    own_stack.start_server()  # L1 empty; the chunks are in L2 only
    eng.wait_lmcache("healthy", 30)
    time.sleep(1.5)  # the engine's worker has registered its KV caches with the new server
    own_stack.redis.signal(signal.SIGSTOP)
    try:
        own_stack.server.signal(signal.SIGSTOP)
        try:
            r = eng.complete(p, 8, ignore_eos=True)  # its LOOKUP waits in the server's socket
        finally:
            own_stack.server.signal(signal.SIGCONT)
        assert stats(r)["lookup"] == "timeout", stats(r)
        assert ids(r) == ids(twin.complete(p, 8, ignore_eos=True))
        eng.wait_lmcache("healthy", 30)
        time.sleep(1.5)
    finally:
        own_stack.redis.signal(signal.SIGCONT)
    deadline = time.monotonic() + 15
    while eng.state()["num_open_sessions"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert eng.state()["num_open_sessions"] == 0
    clean = wait_clean(own_stack, 10)
    text = own_stack.server.log_path.read_text(errors="replace")  # appended over restarts
    since = text[text.rfind("Starting PrefetchController"):]
    log = [line for line in since.splitlines() if "free_lookup_locks" in line or "Prefetch" in line]
    assert clean == (0, 0), log
    return log
