"""A FREE_LOOKUP_LOCKS lost with a cut connection is found and counted (the window of
scenarios/findings/lock-free-lost-on-cut.yaml).

Input that showed the need: `kvchaos explore --stack compose/reference.yml --seed 9`, scenario 0
(a Toxiproxy `limit_data` of 2048 bytes on engine-lmcache's upstream stream for the whole fault
phase) failed `leaks` with lmcache.read_locked_count=3 or 4 in 3 of 5 runs (2026-12-07). With
LMCACHE_LOG_LEVEL=DEBUG: the lookup of fault-1-2-1 read-locked 3 keys, its retrieve timed out,
the engine sent the lock free at 07:23:59.707, Toxiproxy closed that connection at 07:23:59
after discarding 1,085 bytes past the limit, and LMCache logged no "L1 read finished" for it,
only the END_SESSION that followed on the reconnected socket. Nothing in the engine saw the loss
(the adapter drops the reply future), so the finding had no trigger to prove its window. The
rule is the END_SESSION one (test_connector_lost_end_session.py): no reply while a PING sent
after it on the same request client was answered.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from test_connector_late_lookups import LookupScheduler
from test_connector_lost_end_session import EndSessionClient, track, wait_past_mq_timeout

from chaos.engine.connector import LMCacheConnector

from test_connector_late_transfers import FakeFuture


class FreeClient(EndSessionClient):
    """The request client with FREE_LOOKUP_LOCKS (``free_lookup_locks(key, tp_size)``)."""

    def __init__(self, lookup) -> None:
        super().__init__(lookup)
        self.frees: list[FakeFuture] = []

    def free_lookup_locks(self, key, tp_size):
        fut = FakeFuture()
        self.frees.append(fut)
        return fut


@pytest.fixture()
def tracked() -> tuple[LMCacheConnector, LookupScheduler, FreeClient]:
    return track(FreeClient)


def key(request_id: str) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id, start=0, end=768)


def test_lock_free_unanswered_while_a_later_ping_is_answered_is_lost(
        tracked, caplog: pytest.LogCaptureFixture) -> None:
    conn, _, client = tracked
    client.free_lookup_locks(key("fault-1-2-1"), 1)  # written past limit_data's byte count
    client.ping().answer(True)  # the reconnected socket answers the heartbeat
    assert conn.check_end_sessions() == 0  # prunes the answered PING: it must still count
    assert conn.check_lock_frees() == 0, "its reply may still be on its way"
    wait_past_mq_timeout(conn)
    conn.check_end_sessions()
    with caplog.at_level(logging.WARNING, logger="kvchaos.engine.connector"):
        assert conn.check_lock_frees() == 1
    assert conn.lock_frees_lost == 1
    assert "FREE_LOOKUP_LOCKS for request_id=fault-1-2-1 was lost" in caplog.text
    assert conn.check_lock_frees() == 0, "counted once"
    assert conn.end_sessions_lost == 0


def test_lock_free_answered_is_not_lost(tracked) -> None:
    conn, _, client = tracked
    client.free_lookup_locks(key("r-0"), 1)
    client.ping().answer(True)
    conn.check_lock_frees()
    client.frees[0].answer(None)
    wait_past_mq_timeout(conn)
    assert conn.check_lock_frees() == 0
    assert conn.lock_frees_lost == 0


def test_lock_free_still_in_the_pipe_is_not_lost(tracked) -> None:
    conn, _, client = tracked
    client.free_lookup_locks(key("r-1"), 1)
    client.ping()  # not answered: the link is down, the FREE may still wait in the pipe
    wait_past_mq_timeout(conn)
    assert conn.check_lock_frees() == 0
    wait_past_mq_timeout(conn)
    assert conn.check_lock_frees() == 0


def test_two_frees_of_one_request_are_counted_apart(tracked) -> None:
    """A request frees twice (a local hit's range, then a failed load's): each is its own."""
    conn, _, client = tracked
    client.free_lookup_locks(key("r-2"), 1)
    client.free_lookup_locks(key("r-2"), 1)
    client.frees[0].answer(None)
    client.ping().answer(True)
    conn.check_lock_frees()
    wait_past_mq_timeout(conn)
    assert conn.check_lock_frees() == 1


def test_lock_free_of_a_lookup_given_up_as_lost_is_not_tracked(tracked) -> None:
    conn, _, client = tracked
    conn._lost_lookups.add("r-3")
    client.free_lookup_locks(key("r-3"), 1)
    client.ping().answer(True)
    conn.check_lock_frees()
    wait_past_mq_timeout(conn)
    assert conn.check_lock_frees() == 0
