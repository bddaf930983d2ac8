"""Acceptance 2: each toxic measured on real sockets through a running server (the bundled
proxy and the real Toxiproxy alike).

Timing is asserted only where a toxic guarantees it: a delay is a lower bound (nothing makes a
delayed round trip faster), a cap is a bound on bytes over elapsed time. Upper bounds on a
round trip hold a margin of seconds, so a loaded machine does not fail them; which connections
a toxic acted on is read from the bundled proxy's per-toxic counters, not from round-trip times.
"""

from __future__ import annotations

import hashlib
import os
import socket
import statistics
import time

import pytest

PAYLOAD = os.urandom(500_000)
#: Slack on an upper bound of a duration (s): what a loaded machine may add to a round trip.
MARGIN_S = 2.0


def sender(payload: bytes):
    """Upstream handler: send ``payload`` at once, then close."""
    def handle(conn: socket.socket) -> None:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)
    return handle


@pytest.fixture
def echo_proxy(client, echo_upstream):
    return client.create_proxy("echo", "127.0.0.1:0", echo_upstream.address)


@pytest.fixture
def sender_proxy(client, net):
    up = net.Upstream(sender(PAYLOAD))
    yield client.create_proxy("send", "127.0.0.1:0", up.address)
    up.close()


def rtt(sock: socket.socket, net, size: int = 1) -> float:
    t0 = time.perf_counter()
    sock.sendall(b"x" * size)
    assert net.recv_exact(sock, size) == b"x" * size
    return time.perf_counter() - t0


def acted(client, real, key) -> int | None:
    """Connections the toxic ``key`` = (proxy, toxic) acted on (bundled proxy), None on the real
    server (it exports no per-toxic counter: asserted empty)."""
    counts = client.toxic_connection_counts()
    if real:
        assert counts == {}
        return None
    return counts.get(key, 0)


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
def test_latency_delays_every_round_trip(client, echo_proxy, net, stream, real):
    client.add_toxic("echo", "latency", {"latency": 100}, stream=stream)
    s = net.connect(echo_proxy.listen)
    samples = [rtt(s, net) for _ in range(5)]
    s.close()
    assert min(samples) >= 0.099, samples  # the delay is a lower bound
    assert statistics.median(samples) <= 0.100 + MARGIN_S, samples
    assert acted(client, real, ("echo", f"latency_{stream}")) in (1, None)


def test_latency_jitter_spreads_delays(client, echo_proxy, net):
    client.add_toxic("echo", "latency", {"latency": 60, "jitter": 30})
    s = net.connect(echo_proxy.listen)
    samples = [rtt(s, net) for _ in range(8)]
    s.close()
    assert all(0.029 <= x <= 0.090 + MARGIN_S for x in samples), samples
    assert max(samples) - min(samples) > 0.005, samples


def test_limit_data_delivers_exactly_n_bytes_then_eof(client, sender_proxy, net, real):
    client.add_toxic("send", "limit_data", {"bytes": 12_345})
    s = net.connect(sender_proxy.listen)
    got = net.recv_all(s)
    s.close()
    assert got == PAYLOAD[:12_345]
    assert acted(client, real, ("send", "limit_data_downstream")) in (1, None)


def test_limit_data_upstream_counts_across_writes(client, net):
    received = []

    def sink(conn: socket.socket) -> None:
        buf = bytearray()
        while data := conn.recv(65536):
            buf += data
        received.append(bytes(buf))

    up = net.Upstream(sink)
    p = client.create_proxy("sink", "127.0.0.1:0", up.address)
    client.add_toxic("sink", "limit_data", {"bytes": 10}, stream="upstream")
    s = net.connect(p.listen)
    for part in (b"abcd", b"efgh", b"ijkl"):
        try:
            s.sendall(part)
        except OSError:
            break
        time.sleep(0.05)
    assert s.recv(10) == b""  # the proxy closed the connection
    s.close()
    deadline = time.time() + 3
    while not received and time.time() < deadline:
        time.sleep(0.01)
    up.close()
    assert received == [b"abcdefghij"]


def test_timeout_holds_then_closes(client, echo_proxy, net):
    client.add_toxic("echo", "timeout", {"timeout": 300})
    s = net.connect(echo_proxy.listen)
    t0 = time.perf_counter()
    s.sendall(b"hello")
    assert s.recv(10) == b""  # no data, then EOF
    held = time.perf_counter() - t0
    s.close()
    assert 0.29 <= held <= 0.3 + MARGIN_S, held


def test_timeout_zero_holds_until_removed(client, echo_proxy, net):
    client.add_toxic("echo", "timeout", {"timeout": 0})
    s = net.connect(echo_proxy.listen)
    s.sendall(b"hello")
    s.settimeout(0.5)
    with pytest.raises(socket.timeout):
        s.recv(10)  # held open, data dropped
    s.settimeout(3)
    client.remove_toxic("echo", "timeout_downstream")
    assert s.recv(10) == b""  # removal closes what it held (Toxiproxy's Cleanup)
    s.close()
    s = net.connect(echo_proxy.listen)  # new connections flow again
    s.sendall(b"ok")
    assert net.recv_exact(s, 2) == b"ok"
    s.close()


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
def test_reset_peer_gives_econnreset(client, echo_proxy, net, stream):
    client.add_toxic("echo", "reset_peer", {"timeout": 50}, stream=stream)
    s = net.connect(echo_proxy.listen)
    s.sendall(b"hello")
    t0 = time.perf_counter()
    with pytest.raises(ConnectionResetError):
        s.recv(10)
    assert time.perf_counter() - t0 >= 0.04
    s.close()


def test_slicer_splits_one_write_into_several_reads(client, sender_proxy, net):
    client.add_toxic("send", "slicer", {"average_size": 1000, "size_variation": 200,
                                        "delay": 2000})
    s = net.connect(sender_proxy.listen)
    reads = []
    while data := s.recv(1 << 20):
        reads.append(len(data))
        if sum(reads) >= 30_000:
            break
    s.close()
    assert len(reads) >= 10, reads
    assert max(reads) <= 5 * 1200, reads  # pieces, not the whole write


def test_slicer_keeps_every_byte_in_order(client, sender_proxy, net):
    client.add_toxic("send", "slicer", {"average_size": 4000, "size_variation": 1000})
    s = net.connect(sender_proxy.listen)
    assert hashlib.sha256(net.recv_all(s)).digest() == hashlib.sha256(PAYLOAD).digest()
    s.close()


def test_bandwidth_within_25_percent(client, sender_proxy, net):
    client.add_toxic("send", "bandwidth", {"rate": 1000})  # 1000 KB/s = 1e6 bytes/s
    s = net.connect(sender_proxy.listen)
    t0 = time.perf_counter()
    got = net.recv_all(s)
    elapsed = time.perf_counter() - t0
    s.close()
    assert got == PAYLOAD
    expected = len(PAYLOAD) / 1e6
    assert 0.75 * expected <= elapsed <= expected + MARGIN_S, elapsed  # the cap: a lower bound


def test_slow_close_delays_the_fin(client, sender_proxy, net):
    client.add_toxic("send", "slow_close", {"delay": 300})
    s = net.connect(sender_proxy.listen)
    got = net.recv_exact(s, len(PAYLOAD))
    t0 = time.perf_counter()
    assert s.recv(10) == b""
    assert time.perf_counter() - t0 >= 0.25
    assert got == PAYLOAD
    s.close()


#: The delay the toxicity tests use: a round trip the toxic acted on lasts at least this long,
#: one it did not is far shorter, even on a loaded machine.
TOXIC_DELAY_S = 0.4
#: A delayed round trip measured from here may end a hair early (timer resolution).
DELAYED_S = TOXIC_DELAY_S - 0.01


@pytest.mark.parametrize("toxicity", [0.0, 1.0])
def test_toxicity_zero_never_one_always(client, echo_proxy, net, real, toxicity):
    client.add_toxic("echo", "latency", {"latency": int(TOXIC_DELAY_S * 1000)}, toxicity=toxicity)
    samples = []
    for _ in range(12):
        s = net.connect(echo_proxy.listen)
        samples.append(rtt(s, net))
        s.close()
    n = acted(client, real, ("echo", "latency_downstream"))
    if toxicity == 1.0:
        assert all(x >= DELAYED_S for x in samples), samples  # every one delayed
        assert n in (12, None)
    else:
        assert n in (0, None)
        assert all(x < DELAYED_S for x in samples), samples  # a margin of 0.4 s each


def test_toxicity_half_is_seeded_and_mixed(client, echo_proxy, net, real):
    client.add_toxic("echo", "latency", {"latency": int(TOXIC_DELAY_S * 1000)}, toxicity=0.5)
    slow = 0
    for _ in range(20):
        s = net.connect(echo_proxy.listen)
        slow += rtt(s, net) >= DELAYED_S
        s.close()
    n = acted(client, real, ("echo", "latency_downstream"))
    if n is not None:  # the counter says how many: each of them was delayed (a load only adds)
        assert 3 <= n <= 17 and slow >= n, (n, slow)
    else:
        assert 3 <= slow <= 17, slow


def test_toxics_chain_in_order(client, sender_proxy, net):
    # slicer then limit_data: the limit cuts inside a slice, still exactly N bytes.
    client.add_toxic("send", "slicer", {"average_size": 700, "size_variation": 100})
    client.add_toxic("send", "limit_data", {"bytes": 5_000})
    client.add_toxic("send", "latency", {"latency": 30})
    assert [t.type for t in client.toxics("send")] == ["slicer", "limit_data", "latency"]
    s = net.connect(sender_proxy.listen)
    t0 = time.perf_counter()
    got = net.recv_all(s)
    assert time.perf_counter() - t0 >= 0.025
    assert got == PAYLOAD[:5_000]
    s.close()
