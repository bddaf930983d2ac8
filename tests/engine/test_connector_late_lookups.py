"""A lock free of a lookup the engine gave up on waits for the server's prefetch of that lookup.

Input that showed it (CI of 4798703, scenarios/lmcache-restart.yaml with the real Toxiproxy; then
1 run in 15 here with `kvchaos run --proxy real`): LMCache was SIGKILLed just before the crash
phase's three LOOKUPs were sent. The adapter's ack timeout gave up on them (and dropped their
futures); the engine kept their lock frees and END_SESSIONs for when the server answered pings
again. But the LOOKUPs had waited in the message queue's pipe, and the restarted server got them
the moment the connection came back: it started three prefetches from the L2 tiers (its L1 was
empty). The engine's replayed FREE_LOOKUP_LOCKS came 30 ms after health returned, while those
prefetches still ran; LMCache then releases nothing ("free_lookup_locks for request crash-0-0
while its prefetch is still running; leaving its locks to the prefetch controller") and the
finished prefetches kept their chunks read-locked: `leaks: lmcache.read_locked_count=9` (2+3+4
chunks) after 15 s of quiesce. In the runs that passed the LOOKUPs were lost with the old
connection, or the prefetch finished before the FREE arrived. These tests drive the order with
the adapter replaced by fakes whose replies the test releases.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from test_connector_late_transfers import PROMPT, FakeFuture, FakeScheduler

from chaos.engine.connector import LMCacheConnector

MQ_TIMEOUT_S = 0.3
URL = "tcp://127.0.0.1:1"


class FakeLookupClient:
    """The scheduler adapter's RequestClient: LOOKUP and QUERY_PREFETCH_STATUS return pending
    futures the test answers."""

    def __init__(self) -> None:
        self.lookups: list[FakeFuture] = []
        self.queries: list[tuple[str, FakeFuture]] = []

    def lookup(self, key, tp_size):
        fut = FakeFuture()
        self.lookups.append(fut)
        return fut

    def query_prefetch_status(self, request_id):
        fut = FakeFuture()
        self.queries.append((request_id, fut))
        return fut


class LookupScheduler(FakeScheduler):
    """A scheduler adapter that sends its LOOKUPs through ``req_clients`` and reports the
    lookup results the test sets (0 while unhealthy, as lmcache's ``check_lookup_result``)."""

    def __init__(self) -> None:
        super().__init__()
        self.req_clients = {URL: FakeLookupClient()}
        self.results: dict[str, int | None] = {}

    def maybe_submit_lookup_request(self, request_id, token_ids, cache_salt="",
                                    reserve_last_token=True):
        super().maybe_submit_lookup_request(request_id, token_ids, cache_salt, reserve_last_token)
        key = SimpleNamespace(request_id=request_id, start=0, end=1024)
        for client in self.req_clients.values():
            client.lookup(key, 1)

    def check_lookup_result(self, request_id):
        if not self.is_healthy:
            return 0
        return self.results.get(request_id)


def make_connector() -> tuple[LMCacheConnector, LookupScheduler, FakeLookupClient]:
    conn = LMCacheConnector(URL, "m", 16, pool=None, mq_timeout=MQ_TIMEOUT_S,
                            heartbeat_interval=1.0, prefill_segment=256)
    sched = LookupScheduler()
    conn.scheduler = sched
    conn.worker = SimpleNamespace(is_healthy=True)
    conn.chunk_size = 256
    conn._track_lookups(sched)
    return conn, sched, sched.req_clients[URL]


def lookup_given_up_while_down(conn: LMCacheConnector, sched: LookupScheduler,
                               request_id: str) -> FakeFuture:
    """LOOKUP sent just as the server died; the adapter gives up on it (server unhealthy); the
    engine frees the whole range it may have locked and ends the request, both kept."""
    assert conn.submit_lookup(request_id, PROMPT, "")
    ack = sched.req_clients[URL].lookups[-1]
    sched.is_healthy = False
    assert conn.poll_lookup(request_id).status == "timeout"
    conn.free_locks(request_id, PROMPT, "", 0, 1024)
    conn.end_request(request_id)
    assert sched.calls == [("lookup", request_id)]
    return ack


def test_a_lookup_the_restarted_server_got_late_is_freed_after_its_prefetch() -> None:
    conn, sched, client = make_connector()
    ack = lookup_given_up_while_down(conn, sched, "crash-0-0")
    sched.is_healthy = True  # the restarted server answers pings
    ack.answer(None)  # ...and got the LOOKUP that waited in the pipe: its prefetch runs
    conn.flush_deferred()
    assert sched.calls == [("lookup", "crash-0-0")], "a FREE now would release nothing"
    assert [rid for rid, _ in client.queries] == ["crash-0-0"]
    client.queries[-1][1].answer(None)  # still prefetching
    conn.flush_deferred()
    assert sched.calls == [("lookup", "crash-0-0")]
    assert len(client.queries) == 2, "asks again while the prefetch runs"
    client.queries[-1][1].answer(4)  # finished: 4 chunks read-locked, result on the session
    conn.flush_deferred()
    assert sched.calls == [("lookup", "crash-0-0"), ("free", "crash-0-0", 0, 1024),
                           ("end_session", "crash-0-0")]
    assert conn.open_sessions == set()
    assert not conn.lookup_ack_pending("crash-0-0")


def test_a_lookup_never_answered_after_the_restart_was_lost_so_its_free_is_dropped() -> None:
    conn, sched, client = make_connector()
    lookup_given_up_while_down(conn, sched, "crash-1-0")
    sched.is_healthy = True
    conn.flush_deferred()  # starts the wait for the LOOKUP's reply
    assert sched.calls == [("lookup", "crash-1-0")]
    time.sleep(MQ_TIMEOUT_S + 0.05)  # a lower bound: a slower host only waits longer
    conn.flush_deferred()
    # The server is asked whether it got the LOOKUP (QUERY_PREFETCH_STATUS creates no session)
    assert [rid for rid, _ in client.queries] == ["crash-1-0"]
    assert sched.calls == [("lookup", "crash-1-0")]
    client.queries[-1][1].answer(0)  # it does not know the request
    conn.flush_deferred()
    # Lost with the old connection: nothing of it is locked on the new server, and a FREE
    # there would make a session.
    assert sched.calls == [("lookup", "crash-1-0"), ("end_session", "crash-1-0")]


def test_a_lookup_whose_reply_was_lost_on_the_way_back_is_freed() -> None:
    """Input that showed it: `kvchaos explore --seed 1` on the clean reference engine, scenario
    1-5 (l2_fault_inject, retrieve_fail, timeout), cut by hand to its timeout fault alone
    (docs/explore.md, "Failures of the clean stack"): a toxiproxy ``timeout`` toxic (500 ms) on
    the engine-lmcache link's downstream stream while 2 warm 256-token prefixes were re-sent let
    the LOOKUPs reach LMCache and dropped its replies. The server locked the 2 hit chunks; the engine, its LOOKUPs never
    answered once the server was healthy again, took them for lost with the connection and
    dropped their lock frees: ``leaks: lmcache.read_locked_count=2`` after the quiesce, a leak
    the engine made, not LMCache. Now the server is asked first."""
    conn, sched, client = make_connector()
    lookup_given_up_while_down(conn, sched, "cut-0-0")  # its ack never comes
    sched.is_healthy = True
    conn.flush_deferred()
    time.sleep(MQ_TIMEOUT_S + 0.05)
    conn.flush_deferred()
    assert sched.calls == [("lookup", "cut-0-0")], "nothing sent before the server answered"
    client.queries[-1][1].answer(1)  # it handled the LOOKUP: 1 chunk locked, result on the session
    conn.flush_deferred()
    assert sched.calls == [("lookup", "cut-0-0"), ("free", "cut-0-0", 0, 1024), ("end_session", "cut-0-0")]
    assert conn.open_sessions == set() and conn._unanswered_probes == {}


def test_a_lookup_whose_status_query_is_never_answered_counts_as_lost() -> None:
    conn, sched, client = make_connector()
    lookup_given_up_while_down(conn, sched, "gone-0-0")
    sched.is_healthy = True
    conn.flush_deferred()
    time.sleep(MQ_TIMEOUT_S + 0.05)
    conn.flush_deferred()  # asks
    assert sched.calls == [("lookup", "gone-0-0")]
    time.sleep(MQ_TIMEOUT_S + 0.05)  # no answer to the query either
    conn.flush_deferred()
    assert sched.calls == [("lookup", "gone-0-0"), ("end_session", "gone-0-0")]


def test_a_prefetch_still_running_after_mq_timeout_gets_its_free_anyway() -> None:
    conn, sched, client = make_connector()
    ack = lookup_given_up_while_down(conn, sched, "crash-2-0")
    sched.is_healthy = True
    ack.answer(None)
    conn.flush_deferred()
    client.queries[-1][1].answer(None)
    time.sleep(MQ_TIMEOUT_S + 0.05)
    conn.flush_deferred()
    assert sched.calls == [("lookup", "crash-2-0"), ("free", "crash-2-0", 0, 1024),
                           ("end_session", "crash-2-0")]


def test_a_lookup_deadline_on_an_unacknowledged_lookup_waits_for_its_prefetch() -> None:
    """The engine's own deadline (mq_timeout + 1 s) passed while the server, healthy to the
    adapter, had not acknowledged the LOOKUP yet (frozen): when it handles the LOOKUP later its
    prefetch runs, and the free waits for it."""
    conn, sched, client = make_connector()
    assert conn.submit_lookup("slow", PROMPT, "")
    conn._lookup_started["slow"] -= MQ_TIMEOUT_S + 1.5  # past the engine's deadline
    assert conn.poll_lookup("slow").status == "timeout"
    conn.free_locks("slow", PROMPT, "", 0, 1024)
    conn.end_request("slow")
    assert sched.calls == [("lookup", "slow")]
    client.lookups[-1].answer(None)  # handled late: its prefetch runs
    conn.flush_deferred()
    assert sched.calls == [("lookup", "slow")], "a FREE now would release nothing"
    client.queries[-1][1].answer(3)
    conn.flush_deferred()
    assert sched.calls == [("lookup", "slow"), ("free", "slow", 0, 1024), ("end_session", "slow")]


def test_a_deadline_on_an_acknowledged_lookup_frees_at_once_during_its_prefetch() -> None:
    """Input that showed it: the CI of 7677dab, tests/catalogue/test_windows_under_load.py with
    scenarios/findings/frozen-l2-locks-outlive-read-ttl.yaml ended unknown (its trigger "free_
    lookup_locks ... while its prefetch is still running" not reached). The server acknowledged
    the LOOKUP at once and its prefetch waited for the frozen Redis; the engine's deadline gave
    up on it, and its free then waited up to mq_timeout for the prefetch as well, so on a loaded
    host Redis had resumed before the FREE went out and LMCache's leak was never reached. A
    production scheduler frees what it abandons at its deadline: so does the engine."""
    conn, sched, client = make_connector()
    assert conn.submit_lookup("frozen-0-0", PROMPT, "")
    client.lookups[-1].answer(None)  # acknowledged; the prefetch waits for the frozen L2
    conn._lookup_started["frozen-0-0"] -= MQ_TIMEOUT_S + 1.5  # past the engine's deadline
    assert conn.poll_lookup("frozen-0-0").status == "timeout"
    conn.free_locks("frozen-0-0", PROMPT, "", 0, 1024)
    conn.end_request("frozen-0-0")
    assert sched.calls == [("lookup", "frozen-0-0"), ("free", "frozen-0-0", 0, 1024),
                           ("end_session", "frozen-0-0")]
    assert client.queries == [], "no status query: the engine abandons the prefetch"
    assert conn._lookup_acks == {}


def test_a_lookup_with_a_known_outcome_is_freed_at_once_without_a_status_query() -> None:
    conn, sched, client = make_connector()
    assert conn.submit_lookup("hit", PROMPT, "")
    client.lookups[-1].answer(None)
    sched.results["hit"] = 1024
    assert conn.poll_lookup("hit").status == "hit"
    conn.free_locks("hit", PROMPT, "", 0, 512)  # the local prefix cache covers [0, 512)
    assert sched.calls == [("lookup", "hit"), ("free", "hit", 0, 512)]
    assert client.queries == []
    conn.end_request("hit")
    assert sched.calls[-1] == ("end_session", "hit")
    assert conn._lookup_acks == {}
