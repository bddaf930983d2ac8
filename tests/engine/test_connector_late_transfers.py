"""The connector's clean-ups wait for the replies of retrieves and stores the server may still handle.

Input that showed it (stop 26's CI, scenarios/load-fail-policy-fail.yaml with the real Toxiproxy,
then 1 run in 6 here): LMCache frozen (SIGSTOP) while the engine retrieved; the retrieve's
PREPARE_RETRIEVE and COMMIT_RETRIEVE timed out on the client (mq_timeout) but stayed queued on
the server; the engine (kv_load_failure_policy=fail) freed the lookup's locks and ended the
session, replayed once the server answered pings again. The server then handled the queued
retrieve after END_SESSION: its handler's ``session_manager.get_or_create`` made the session
again (``leaks: lmcache.active_sessions=1`` after 15 s of quiesce), and its
``finish_read_prefetched`` released the locks FREE had already released ("L1Manager: finish read
on non-read-locked key" for the 4 chunks). Which of the two connections the server reads first is
not ordered, so the end-to-end run fails only sometimes; these tests drive the connector's
ordering with the adapter replaced by fakes whose replies the test releases.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from chaos.engine.connector import LMCacheConnector


class FakeFuture:
    """A MessagingFuture whose reply the test sets (``query``/``result`` as lmcache's)."""

    def __init__(self) -> None:
        self.reply = None
        self.done = False

    def query(self) -> bool:
        return self.done

    def result(self, timeout: float | None = None):
        assert self.done
        return self.reply

    def answer(self, reply) -> None:
        self.reply, self.done = reply, True


class FakeClient:
    """The worker adapter's RequestClient: every transfer RPC returns a pending future."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, FakeFuture]] = []

    def _rpc(self, op: str, key) -> FakeFuture:
        fut = FakeFuture()
        self.sent.append((op, key.request_id, fut))
        return fut

    def prepare_retrieve(self, key, instance_id):
        return self._rpc("prepare_retrieve", key)

    def commit_retrieve(self, key, instance_id):
        return self._rpc("commit_retrieve", key)

    def prepare_store(self, key, instance_id):
        return self._rpc("prepare_store", key)

    def commit_store(self, key, instance_id, cpu_data=b""):
        return self._rpc("commit_store", key)


class FakeScheduler:
    """LMCache's scheduler adapter: records what the connector sends, in order."""

    is_healthy = True

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self._unacked_lookups: dict = {}
        self._lookup_status: dict = {}

    def maybe_submit_lookup_request(self, request_id, token_ids, cache_salt="", reserve_last_token=True):
        self.calls.append(("lookup", request_id))

    def free_lookup_locks(self, token_ids, start, end, request_id, cache_salt=""):
        self.calls.append(("free", request_id, start, end))

    def end_session(self, request_id):
        self.calls.append(("end_session", request_id))

    def cleanup_lookup_result(self, request_id):
        pass


MQ_TIMEOUT_S = 0.3
PROMPT = list(range(1100))


def make_connector() -> tuple[LMCacheConnector, FakeScheduler, FakeClient]:
    conn = LMCacheConnector("tcp://127.0.0.1:1", "m", 16, pool=None, mq_timeout=MQ_TIMEOUT_S,
                            heartbeat_interval=1.0, prefill_segment=256)
    sched, client = FakeScheduler(), FakeClient()
    conn.scheduler = sched
    conn.worker = SimpleNamespace(is_healthy=True)
    conn.chunk_size = 256
    conn._track_transfers(client)
    return conn, sched, client


def timed_out_retrieve(conn: LMCacheConnector, client: FakeClient, request_id: str) -> FakeFuture:
    """A lookup that hit [0, 1024), then a retrieve whose two RPCs the client gave up on."""
    assert conn.submit_lookup(request_id, PROMPT, "")
    key = SimpleNamespace(request_id=request_id, start=0, end=1024)
    prepare = client.prepare_retrieve(key, 7)
    client.commit_retrieve(key, 7)
    return prepare


def fail_and_end(conn: LMCacheConnector, request_id: str) -> None:
    """What the scheduler does after a failed load with kv_load_failure_policy=fail."""
    conn.free_locks(request_id, PROMPT, "", 0, 1024)
    conn.end_request(request_id)


def test_late_successful_retrieve_releases_the_locks_and_end_session_follows_it() -> None:
    conn, sched, client = make_connector()
    prepare = timed_out_retrieve(conn, client, "r0")
    fail_and_end(conn, "r0")
    conn.flush_deferred()
    assert sched.calls == [("lookup", "r0")], "nothing may follow while the retrieve is unanswered"
    assert conn.unanswered_transfer("r0")
    prepare.answer(SimpleNamespace(success=True, data=b"x"))
    conn.flush_deferred()
    assert sched.calls == [("lookup", "r0")]  # COMMIT_RETRIEVE still unanswered
    for op, rid, fut in client.sent:
        if op == "commit_retrieve":
            fut.answer(True)
    conn.flush_deferred()
    # The server released the chunks when it handled PREPARE_RETRIEVE: no second release.
    assert sched.calls == [("lookup", "r0"), ("end_session", "r0")]
    assert conn.open_sessions == set()
    assert not conn.unanswered_transfer("r0")


def test_late_failed_retrieve_still_gets_its_free_before_end_session() -> None:
    conn, sched, client = make_connector()
    timed_out_retrieve(conn, client, "r1")
    fail_and_end(conn, "r1")
    for _, _, fut in client.sent:
        fut.answer(SimpleNamespace(success=False, data=b""))
    conn.flush_deferred()
    assert sched.calls == [("lookup", "r1"), ("free", "r1", 0, 1024), ("end_session", "r1")]


def test_a_transfer_never_answered_is_given_up_after_mq_timeout_of_health() -> None:
    conn, sched, client = make_connector()
    timed_out_retrieve(conn, client, "r2")
    fail_and_end(conn, "r2")
    conn.flush_deferred()  # starts the wait
    assert sched.calls == [("lookup", "r2")]
    time.sleep(MQ_TIMEOUT_S + 0.05)  # a lower bound: a slower host only waits longer
    conn.flush_deferred()
    # Lost with the connection: the server never released the locks, so FREE is sent.
    assert sched.calls == [("lookup", "r2"), ("free", "r2", 0, 1024), ("end_session", "r2")]
    assert not conn.unanswered_transfer("r2")


def test_a_late_store_holds_end_session_too() -> None:
    conn, sched, client = make_connector()
    assert conn.submit_lookup("s0", PROMPT, "")
    key = SimpleNamespace(request_id="s0", start=0, end=1024)
    commit = client.commit_store(key, 7)
    conn.end_request("s0")
    conn.flush_deferred()
    assert ("end_session", "s0") not in sched.calls
    commit.answer(True)
    conn.flush_deferred()
    assert sched.calls[-1] == ("end_session", "s0")


def test_a_new_lookup_of_the_request_locks_again_so_its_free_is_sent() -> None:
    conn, sched, client = make_connector()
    prepare = timed_out_retrieve(conn, client, "r3")
    for _, _, fut in client.sent:
        fut.answer(SimpleNamespace(success=True, data=b"x") if fut is prepare else True)
    assert not conn.unanswered_transfer("r3")
    assert conn.released_by_retrieve("r3", 0, 1024)
    assert conn.submit_lookup("r3", PROMPT, "")  # e.g. resumed after a preemption
    assert not conn.released_by_retrieve("r3", 0, 1024)
    conn.free_locks("r3", PROMPT, "", 0, 1024)
    assert sched.calls[-1] == ("free", "r3", 0, 1024)


def test_clean_ups_without_transfers_are_sent_at_once() -> None:
    conn, sched, _ = make_connector()
    assert conn.submit_lookup("q", PROMPT, "")
    fail_and_end(conn, "q")
    assert sched.calls == [("lookup", "q"), ("free", "q", 0, 1024), ("end_session", "q")]
