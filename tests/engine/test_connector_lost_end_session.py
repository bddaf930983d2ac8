"""An END_SESSION lost with a reset connection is found and counted (the window of
scenarios/findings/end-session-lost-on-reset.yaml).

Input that showed the need (make test of 0cbf55b, 2026-12-06 21:00): the finding's phase
trigger ("a LOOKUP timed out or LMCache unhealthy") was reached by runs whose reset met no
finishing request, so a fresh clone's bundled run XPASSed while the real-Toxiproxy run XFAILed.
The trigger is now the engine's own evidence that an END_SESSION of a session the server holds
was written into a connection and never arrived: no reply, while a PING sent after it on the
same request client (the same ZeroMQ socket and pipe, in order) was answered. These tests drive
the order with LMCache's request client replaced by a fake whose replies the test releases.
"""

from __future__ import annotations

import logging
import time

import pytest
from test_connector_late_lookups import URL, LookupScheduler, make_connector

from chaos.engine.connector import LMCacheConnector

from test_connector_late_transfers import FakeFuture


class EndSessionClient:
    """LMCache's RequestClient as the scheduler adapter uses it: END_SESSION, PING and LOOKUP
    return pending futures the test answers."""

    def __init__(self, lookup) -> None:
        self.lookup = lookup
        self.end_sessions: dict[str, FakeFuture] = {}
        self.pings: list[FakeFuture] = []

    def end_session(self, request_id):
        fut = FakeFuture()
        self.end_sessions[request_id] = fut
        return fut

    def ping(self, instance_id=None):
        fut = FakeFuture()
        self.pings.append(fut)
        return fut

    def query_prefetch_status(self, request_id):
        return FakeFuture()


def track(client_cls: type) -> tuple[LMCacheConnector, LookupScheduler, EndSessionClient]:
    """A connector whose scheduler adapter's one request client is a ``client_cls``."""
    conn, sched, lookups = make_connector()
    client = client_cls(lookups.lookup)
    sched.req_clients = {URL: client}
    conn._track_lookups(sched)
    return conn, sched, client


@pytest.fixture()
def tracked() -> tuple[LMCacheConnector, LookupScheduler, EndSessionClient]:
    return track(EndSessionClient)


def wait_past_mq_timeout(conn: LMCacheConnector) -> None:
    time.sleep(conn.mq_timeout + 0.05)  # a lower bound: a slower host only waits longer


def test_end_session_unanswered_while_a_later_ping_is_answered_is_lost(
        tracked, caplog: pytest.LogCaptureFixture) -> None:
    conn, _, client = tracked
    client.end_session("fault-1-4-0")  # written into the connection the reset then closed
    client.ping().answer(True)  # the reconnected socket answers the heartbeat
    assert conn.check_end_sessions() == 0, "its reply may still be on its way"
    wait_past_mq_timeout(conn)
    with caplog.at_level(logging.WARNING, logger="kvchaos.engine.connector"):
        assert conn.check_end_sessions() == 1
    assert conn.end_sessions_lost == 1
    assert "END_SESSION for request_id=fault-1-4-0 was lost" in caplog.text
    assert conn.check_end_sessions() == 0, "counted once"


def test_end_session_answered_is_not_lost(tracked) -> None:
    conn, _, client = tracked
    client.end_session("r-0")
    client.ping().answer(True)
    conn.check_end_sessions()
    client.end_sessions["r-0"].answer(None)  # the reply came after the PING's
    wait_past_mq_timeout(conn)
    assert conn.check_end_sessions() == 0
    assert conn.end_sessions_lost == 0


def test_end_session_still_in_the_pipe_is_not_lost(tracked) -> None:
    """No PING after it was answered: it may still wait in the socket's pipe for the
    connection to come back (then the server gets it)."""
    conn, _, client = tracked
    client.end_session("r-1")
    client.ping()  # sent after it, not answered (the link is down)
    wait_past_mq_timeout(conn)
    assert conn.check_end_sessions() == 0
    wait_past_mq_timeout(conn)
    assert conn.check_end_sessions() == 0
    assert conn.end_sessions_lost == 0


def test_a_ping_sent_before_the_end_session_proves_nothing(tracked) -> None:
    conn, _, client = tracked
    earlier = client.ping()
    time.sleep(0.01)  # the monotonic clock must tell the two sends apart
    client.end_session("r-2")
    earlier.answer(True)
    wait_past_mq_timeout(conn)
    assert conn.check_end_sessions() == 0
    assert conn.end_sessions_lost == 0


def test_end_session_of_a_session_the_server_never_had_is_not_tracked(tracked) -> None:
    """A request whose LOOKUP is unanswered (or was given up as lost) has no session on the
    server: its END_SESSION lost leaks nothing."""
    conn, _, client = tracked
    assert conn.submit_lookup("r-3", list(range(300)), "")  # its LOOKUP is never answered
    conn._lost_lookups.add("r-4")
    client.end_session("r-3")
    client.end_session("r-4")
    client.ping().answer(True)
    conn.check_end_sessions()
    wait_past_mq_timeout(conn)
    assert conn.check_end_sessions() == 0
