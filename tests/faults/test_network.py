"""Network faults against the real fault proxy (chaos.proxy) and a TCP echo upstream."""

from __future__ import annotations

import socket
import time

import pytest

from chaos.faults.base import FaultContext
from chaos.faults.registry import build_fault, get
from chaos.scenario.model import Scenario
from kvchaos_support import true_within

LINK = "engine-lmcache"

EXAMPLES = {
    "latency": ({"latency_ms": 200, "jitter_ms": 0}, {"latency": 200, "jitter": 0}),
    "timeout": ({"timeout_ms": 0}, {"timeout": 0}),
    "reset_peer": ({"timeout_ms": 10}, {"timeout": 10}),
    "limit_data": ({"bytes": 4}, {"bytes": 4}),
    "slicer": ({"average_size": 8, "size_variation": 2, "delay_us": 10},
               {"average_size": 8, "size_variation": 2, "delay": 10}),
    "bandwidth": ({"rate_kbps": 1}, {"rate": 1}),
}


def _fault(kind: str, **fields):
    """Validate through the scenario model, as a YAML fault would be."""
    item = {"kind": kind, "link": LINK, "duration": 5, **fields}
    s = Scenario.model_validate(
        {"name": "t", "stack": "s.yml", "phases": [{"name": "p", "faults": [item]}],
         "checks": {"evidence": {}}},
        context={"check_paths": False},
    )
    return build_fault(s.phases[0].faults[0])


@pytest.fixture
def link(proxy, echo):
    created = proxy.create_proxy(LINK, "127.0.0.1:0", echo.address)
    return created.listen


def _roundtrip(listen: str, payload: bytes = b"ping", timeout: float = 5.0) -> tuple[bytes, float]:
    host, port = listen.rsplit(":", 1)
    t0 = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        got = _send_and_read(s, payload)
    return got, time.monotonic() - t0


def _send_and_read(conn: socket.socket, payload: bytes) -> bytes:
    """Send ``payload`` to the echo and read until as many bytes came back, the connection
    ended, or the socket's timeout."""
    conn.sendall(payload)
    got = b""
    try:
        while len(got) < len(payload):
            data = conn.recv(65536)
            if not data:
                break
            got += data
    except (ConnectionResetError, socket.timeout):
        pass
    return got


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_each_toxic_kind_round_trips_through_the_proxy(proxy, link, kind):
    fields, attributes = EXAMPLES[kind]
    fault = _fault(kind, **fields, stream="upstream", toxicity=0.5)
    ctx = FaultContext(proxy=proxy)
    applied = fault.apply(ctx)
    assert applied["toxic"] == f"{kind}-0" and applied["type"] == kind
    (toxic,) = proxy.toxics(LINK)
    assert (toxic.name, toxic.type, toxic.stream, toxic.toxicity) == (f"{kind}-0", kind, "upstream", 0.5)
    assert toxic.attributes == attributes
    assert fault.heal(ctx)["removed"] is True
    assert proxy.toxics(LINK) == []
    assert fault.heal(ctx) == {"link": LINK, "toxic": f"{kind}-0", "removed": False, "absent": True}


@pytest.fixture
def real(request: pytest.FixtureRequest) -> bool:
    """True when the test runs against the real Toxiproxy (no per-toxic counters)."""
    return request.node.callspec.params["proxy"] == "real"


def _source(real: bool) -> str:
    return "stream bytes" if real else "toxic counter"


def test_latency_bites_and_says_so(proxy, link, real):
    fault = _fault("latency", latency_ms=300)
    ctx = FaultContext(proxy=proxy)
    fault.apply(ctx)
    assert fault.evidence(ctx)["bit"] is False  # no connection yet
    host, port = link.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as open_conn:  # stays open
        t0 = time.monotonic()
        open_conn.sendall(b"ping")
        assert open_conn.recv(4) == b"ping" and time.monotonic() - t0 >= 0.29
        ev = fault.evidence(ctx)
        assert ev["bit"] is True and ev["source"] == _source(real)
        if real:  # b"ping" came back through it, on a connection that is still open
            assert ev["acted_on"] is None and ev["stream"]["bytes_in"] == 4
        else:
            assert ev["acted_on"] == 1
    fault.heal(ctx)
    assert fault.evidence(ctx)["bit"] is True  # still known after heal
    assert _fast_roundtrip(link, under_s=0.25), "a round trip still as slow as the healed 300 ms latency"


def _fast_roundtrip(listen: str, under_s: float, within_s: float = 10.0) -> bool:
    """Whether, within ``within_s``, one echo round trip through ``listen`` comes back in under
    ``under_s`` (which a latency toxic of more than that could not give). Not one round trip
    alone: on a loaded host one may be slow with no toxic at all."""
    def fast() -> bool:
        got, took = _roundtrip(listen)
        return got == b"ping" and took < under_s

    return true_within(fast, within_s)


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_every_toxic_kind_bites_on_traffic_in_its_window(proxy, link, real, kind, stream):
    fields, _ = EXAMPLES[kind]
    fault = _fault(kind, **fields, stream=stream)
    ctx = FaultContext(proxy=proxy)
    fault.apply(ctx)
    # Cut, reset, held or slowed: it met the toxic. Only the `timeout` toxic holds the bytes
    # for good, so only its round trip is cut short by the client; the others end on their own.
    _roundtrip(link, b"x" * 64, timeout=3 if kind == "timeout" else 30)
    # The proxy must have read the bytes before the heal closes the window. On a loaded host
    # (8 busy loops beside a real-Toxiproxy stack) real limit_data once did not bite here, most
    # likely because the real server read the bytes only after the client had given up and the
    # heal had closed the window (judged from that failure, not reproduced). A toxic no byte met
    # fails this wait as before.
    assert true_within(lambda: (fault.evidence(ctx)["stream"].get("bytes") or 0) > 0, 30), fault.evidence(ctx)
    fault.heal(ctx)
    ev = fault.evidence(ctx)
    assert ev["bit"] is True and ev["source"] == _source(real), ev


def test_toxicity_zero_never_bites(proxy, link, real):
    fault = _fault("timeout", timeout_ms=0, toxicity=0.0)
    ctx = FaultContext(proxy=proxy)
    fault.apply(ctx)
    assert _roundtrip(link)[0] == b"ping"
    fault.heal(ctx)
    ev = fault.evidence(ctx)
    assert ev["bit"] is False
    if real:  # bytes moved, but nothing says the toxic's roll picked their connection
        assert ev["stream"]["bytes"] > 0 and "toxicity" in ev["reason"]
    else:
        assert ev["acted_on"] == 0


def test_counts_from_an_earlier_toxic_of_the_same_name_do_not_count(proxy, link):
    ctx = FaultContext(proxy=proxy)
    first = _fault("latency", latency_ms=1)
    first.apply(ctx)
    _roundtrip(link)
    first.heal(ctx)
    second = _fault("latency", latency_ms=1)  # same default name, latency-0
    second.apply(ctx)
    second.heal(ctx)
    assert first.evidence(ctx)["bit"] is True
    ev = second.evidence(ctx)
    assert ev["bit"] is False and ev["acted_on"] in (0, None)


def test_bytes_outside_the_window_never_count(proxy, link, echo, real):
    """A connection that carried bytes before the toxic and closes while it is in place (the
    real server adds its bytes to toxiproxy_proxy_received_bytes_total at that close), and a
    connection straight to the upstream (not through the proxy): neither is a bite."""
    host, port = link.rsplit(":", 1)
    early = socket.create_connection((host, int(port)), timeout=5)
    early.sendall(b"y" * 10_000)
    got = b""
    while len(got) < 10_000:
        got += early.recv(65536)
    fault = _fault("latency", latency_ms=1, stream="downstream")
    ctx = FaultContext(proxy=proxy)
    fault.apply(ctx)
    early.close()
    uhost, uport = echo.address.rsplit(":", 1)
    with socket.create_connection((uhost, int(uport)), timeout=5) as direct:
        direct.sendall(b"z" * 1000)
        direct.recv(65536)
    deadline = time.monotonic() + 5
    while real and proxy.metrics_text().count('direction="downstream"') == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # the real server counts the early connection's bytes at its close
    if real:
        assert 'toxiproxy_proxy_received_bytes_total{direction="downstream"' in proxy.metrics_text()
    fault.heal(ctx)
    ev = fault.evidence(ctx)
    assert ev["bit"] is False, ev
    if real:
        assert ev["stream"]["connections_closed"] == 1 and ev["stream"]["bytes"] == 0


def test_link_down_cuts_an_open_connection_then_heals(proxy, link):
    fault = _fault("link_down")
    ctx = FaultContext(proxy=proxy)
    host, port = link.rsplit(":", 1)
    held = socket.create_connection((host, int(port)), timeout=5)
    held.sendall(b"hi")
    assert held.recv(2) == b"hi"
    assert fault.apply(ctx) == {"link": LINK, "enabled": False}
    with pytest.raises(OSError):
        _roundtrip(link, timeout=1)
    held.settimeout(5)
    try:
        assert held.recv(10) == b""  # the disable closed it
    except ConnectionResetError:
        pass
    held.close()
    assert fault.heal(ctx) == {"link": LINK, "enabled": True}
    assert _roundtrip(link)[0] == b"ping"
    ev = fault.evidence(ctx)
    assert ev["bit"] is True and ev["disabled"] is True and ev["connections_cut"] == 1, ev
    assert ev["refusing"] is True


def test_link_down_with_no_connection_did_not_bite(proxy, link):
    fault = _fault("link_down")
    ctx = FaultContext(proxy=proxy)
    fault.apply(ctx)
    fault.heal(ctx)
    ev = fault.evidence(ctx)
    assert ev["bit"] is False and "no connection" in ev["reason"], ev


def test_no_proxy_is_a_clear_error():
    fault = _fault("latency", latency_ms=1)
    with pytest.raises(RuntimeError, match="need the stack's proxy"):
        fault.apply(FaultContext(proxy=None))


def test_unknown_link_on_the_proxy_is_raised(proxy):
    fault = _fault("latency", latency_ms=1)
    with pytest.raises(Exception, match="404"):
        fault.apply(FaultContext(proxy=proxy))


class _NoCounters:
    """A proxy API without per-toxic counters (like the real Toxiproxy)."""

    def add_toxic(self, *a, **k):
        return {"name": k["name"]}

    def remove_toxic(self, *a):
        return None

    def get_proxy(self, name):
        raise RuntimeError("no such API")

    def metrics_text(self):
        return "# HELP toxiproxy_proxy_connections_total x\n"


def test_no_counters_means_no_evidence():
    fault = _fault("latency", latency_ms=1)
    ctx = FaultContext(proxy=_NoCounters())
    fault.apply(ctx)
    fault.heal(ctx)
    ev = fault.evidence(ctx)
    assert ev["bit"] is False and ev["acted_on"] is None and "no toxic counters" in ev["reason"]


def test_get_kind_classes_have_params_models():
    for kind in list(EXAMPLES) + ["link_down"]:
        assert get(kind).params_model.model_fields["kind"].annotation.__args__ == (kind,)


def test_a_stale_toxic_of_the_same_name_is_replaced(proxy, link):
    proxy.add_toxic(LINK, "latency", {"latency": 5000}, name="latency-0")
    fault = _fault("latency", latency_ms=1)
    ctx = FaultContext(proxy=proxy)
    applied = fault.apply(ctx)
    assert applied["replaced_stale_toxic"] is True
    (toxic,) = proxy.toxics(LINK)
    assert toxic.attributes["latency"] == 1
    fault.heal(ctx)


def test_limit_data_on_a_transfer_under_way_bites_even_when_the_cut_lands_during_the_add(proxy, real):
    """A stream already flowing when limit_data is added is cut within milliseconds, possibly
    before the add returns (and the connection is gone from every later socket sample): the
    bytes it read after the sample taken just before the add still count."""
    import threading

    def stream_forever(conn: socket.socket) -> None:
        while True:
            conn.sendall(b"s" * 65536)
            time.sleep(0.002)

    from kvchaos_support import Upstream

    up = Upstream(stream_forever)
    try:
        p = proxy.create_proxy("busy", "127.0.0.1:0", up.address)
        host, port = p.listen.rsplit(":", 1)
        conn = socket.create_connection((host, int(port)), timeout=5)
        stop = threading.Event()

        def drain() -> None:
            try:
                while not stop.is_set() and conn.recv(1 << 20):
                    pass
            except OSError:
                pass

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        time.sleep(0.2)  # the transfer is under way
        fault = _fault("limit_data", link="busy", bytes=1000)
        ctx = FaultContext(proxy=proxy)
        fault.apply(ctx)
        reader.join(5)
        assert not reader.is_alive(), "the toxic did not cut the transfer"
        fault.heal(ctx)
        ev = fault.evidence(ctx)
        assert ev["bit"] is True and ev["source"] == _source(real), ev
        stop.set()
        conn.close()
    finally:
        up.close()


def test_a_fault_never_healed_leaves_no_watcher_behind(proxy, link):
    """The kernel watch of a fault's window (ss -E) ends with the fault object."""
    import gc

    import psutil

    fault = _fault("latency", latency_ms=1)
    fault.apply(FaultContext(proxy=proxy))
    watch = fault._window._watch
    pid = watch.proc.pid if watch is not None and watch.proc is not None else None
    del fault, watch
    gc.collect()
    if pid is not None:  # (None: no root or no stdbuf, no watch was started)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


# --- What bytes prove, kind by kind, on both servers (a tester's false passes on the real one) --

def _open(listen: str) -> socket.socket:
    host, port = listen.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _echo_some(conn: socket.socket, n: int) -> bytes:
    return _send_and_read(conn, b"e" * n)


def test_limit_data_that_never_cuts_did_not_bite(proxy, link, real):
    """Found on the real proxy: 19 MB under a 1 GB limit counted as a bite (any byte did)."""
    fault = _fault("limit_data", bytes=1_000_000)
    ctx = FaultContext(proxy=proxy)
    fault.apply(ctx)
    with _open(link) as conn:
        assert _echo_some(conn, 50_000) == b"e" * 50_000
    fault.heal(ctx)
    ev = fault.evidence(ctx)
    assert ev["bit"] is False, ev
    if real:
        assert ev["stream"]["bytes"] >= 50_000 and "was cut" in ev["reason"]


def test_limit_data_that_cuts_a_connection_opened_in_its_window_bit(proxy, link, real):
    """The connection opens and is cut between the window's two samples: only the kernel's
    destroy record of its accepted socket shows it (root)."""
    import os

    if real and os.geteuid() != 0:
        pytest.skip("the kernel's destroyed-socket records need root")
    fault = _fault("limit_data", bytes=1000)
    ctx = FaultContext(proxy=proxy)
    fault.apply(ctx)
    with _open(link) as conn:
        assert len(_echo_some(conn, 50_000)) == 1000
    time.sleep(0.2)
    fault.heal(ctx)
    ev = fault.evidence(ctx)
    assert ev["bit"] is True, ev


def test_a_timeout_closing_an_idle_connection_bit(proxy, link, real):
    """Found on the real proxy: a timeout toxic (timeout_ms > 0) closes an idle connection
    without any byte, which the bundled proxy counted and the byte evidence missed."""
    import os

    if real and os.geteuid() != 0:
        pytest.skip("when the kernel destroyed the socket needs root (ss -E)")
    with _open(link) as conn:
        assert _echo_some(conn, 10) == b"e" * 10  # open before the toxic, idle in its window
        fault = _fault("timeout", timeout_ms=300)
        ctx = FaultContext(proxy=proxy)
        fault.apply(ctx)
        conn.settimeout(5)
        assert conn.recv(10) == b""  # closed by the toxic
        time.sleep(0.2)
        fault.heal(ctx)
    ev = fault.evidence(ctx)
    assert ev["bit"] is True, ev


def test_an_idle_timeout_shorter_than_its_close_did_not_bite(proxy, link, real):
    with _open(link) as conn:
        assert _echo_some(conn, 10) == b"e" * 10
        fault = _fault("timeout", timeout_ms=5000)
        ctx = FaultContext(proxy=proxy)
        fault.apply(ctx)
        time.sleep(0.3)
        fault.heal(ctx)
    ev = fault.evidence(ctx)
    assert ev["bit"] is False, ev


def test_a_toxic_behind_a_black_hole_saw_nothing(proxy, link, real):
    """Found on the real proxy: a latency added after a timeout toxic on the same stream was
    counted as bitten from bytes the timeout (earlier in the chain) dropped."""
    hole = _fault("timeout", name="hole", timeout_ms=0)
    behind = _fault("latency", name="behind-hole", latency_ms=100)
    ctx = FaultContext(proxy=proxy)
    hole.apply(ctx)
    behind.apply(ctx)
    with _open(link) as conn:
        conn.settimeout(0.5)
        conn.sendall(b"x" * 100)
        try:
            assert conn.recv(100) == b""  # the hole drops everything
        except socket.timeout:
            pass
        behind.heal(ctx)
    hole.heal(ctx)
    assert hole.evidence(ctx)["bit"] is True
    ev = behind.evidence(ctx)
    assert ev["bit"] is False, ev
    if real:
        assert ev["stream"]["held_by"] == ["hole"]


def test_a_toxic_that_outlives_the_black_hole_before_it_counts_from_its_removal(proxy, link, real):
    hole = _fault("timeout", name="hole", timeout_ms=0)
    behind = _fault("latency", name="behind-hole", latency_ms=50)
    ctx = FaultContext(proxy=proxy)
    hole.apply(ctx)
    behind.apply(ctx)
    with _open(link) as conn:  # idle while the hole is in place: nothing to drop
        time.sleep(0.2)
    hole.heal(ctx)
    mid = behind.evidence(ctx)
    assert mid["bit"] is False, mid
    with _open(link) as conn:
        assert _echo_some(conn, 100) == b"e" * 100  # through the latency alone
    behind.heal(ctx)
    ev = behind.evidence(ctx)
    assert ev["bit"] is True, ev
    if real:
        assert ev["stream"]["held_by"] == ["hole"] and ev["stream"]["bytes"] >= 100


def test_a_reset_under_way_completes_when_the_fault_is_healed_first(proxy, link, real):
    """Found on the real proxy: its reset_peer waits out its delay before the removal answers
    (the heal failed on the client's 5 s timeout) and the reset still happens; the bundled
    proxy cancelled it. Both now reset, and the heal waits for it."""
    fault = _fault("reset_peer", timeout_ms=1500)
    ctx = FaultContext(proxy=proxy)
    fault.apply(ctx)
    with _open(link) as conn:
        t_sent = time.monotonic()
        conn.sendall(b"x" * 10)  # reaches the toxic: its reset is due 1.5 s later
        time.sleep(0.3)
        fault.heal(ctx)  # before the reset is due (on a quiet host; later under load)
        # The removal waited for the reset: it returns no sooner than 1.5 s after the bytes
        # were sent, however late the heal began (from the send, not from the heal's start,
        # which a loaded host may delay past the reset).
        assert time.monotonic() - t_sent >= 1.5 - 0.05
        conn.settimeout(5)
        with pytest.raises((ConnectionResetError, OSError)):
            if conn.recv(10) == b"":
                raise ConnectionResetError("closed")
    ev = fault.evidence(ctx)
    assert ev["bit"] is True, ev
    assert _roundtrip(link)[0] == b"ping"  # healed


def test_a_latency_of_nothing_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="delays nothing"):
        _fault("latency", latency_ms=0)
    assert _fault("latency", latency_ms=0, jitter_ms=20).params.jitter_ms == 20
