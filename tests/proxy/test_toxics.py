"""Acceptance 2: each toxic measured on real sockets through a running server."""

from __future__ import annotations

import hashlib
import os
import socket
import statistics
import time

import pytest

PAYLOAD = os.urandom(500_000)


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


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
def test_latency_within_20_percent(client, echo_proxy, net, stream):
    client.add_toxic("echo", "latency", {"latency": 100}, stream=stream)
    s = net.connect(echo_proxy.listen)
    median = statistics.median(rtt(s, net) for _ in range(5))
    s.close()
    assert 0.080 <= median <= 0.120, median
    assert client.toxic_connection_counts() == {("echo", f"latency_{stream}"): 1}


def test_latency_jitter_spreads_delays(client, echo_proxy, net):
    client.add_toxic("echo", "latency", {"latency": 60, "jitter": 30})
    s = net.connect(echo_proxy.listen)
    samples = [rtt(s, net) for _ in range(8)]
    s.close()
    assert all(0.025 <= x <= 0.110 for x in samples), samples
    assert max(samples) - min(samples) > 0.005, samples


def test_limit_data_delivers_exactly_n_bytes_then_eof(client, sender_proxy, net):
    client.add_toxic("send", "limit_data", {"bytes": 12_345})
    s = net.connect(sender_proxy.listen)
    got = net.recv_all(s)
    s.close()
    assert got == PAYLOAD[:12_345]
    assert client.toxic_connection_counts() == {("send", "limit_data_downstream"): 1}


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
    assert 0.25 <= held <= 0.6, held


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
    assert 0.75 * expected <= elapsed <= 1.25 * expected, elapsed


def test_slow_close_delays_the_fin(client, sender_proxy, net):
    client.add_toxic("send", "slow_close", {"delay": 300})
    s = net.connect(sender_proxy.listen)
    got = net.recv_exact(s, len(PAYLOAD))
    t0 = time.perf_counter()
    assert s.recv(10) == b""
    assert time.perf_counter() - t0 >= 0.25
    assert got == PAYLOAD
    s.close()


@pytest.mark.parametrize("toxicity, expect_slow", [(0.0, 0), (1.0, 12)])
def test_toxicity_zero_never_one_always(client, echo_proxy, net, toxicity, expect_slow):
    client.add_toxic("echo", "latency", {"latency": 60}, toxicity=toxicity)
    slow = 0
    for _ in range(12):
        s = net.connect(echo_proxy.listen)
        slow += rtt(s, net) >= 0.05
        s.close()
    assert slow == expect_slow
    counts = client.toxic_connection_counts()
    assert counts.get(("echo", "latency_downstream"), 0) == expect_slow


def test_toxicity_half_is_seeded_and_mixed(client, echo_proxy, net):
    client.add_toxic("echo", "latency", {"latency": 40}, toxicity=0.5)
    slow = 0
    for _ in range(20):
        s = net.connect(echo_proxy.listen)
        slow += rtt(s, net) >= 0.03
        s.close()
    assert 3 <= slow <= 17, slow
    assert client.toxic_connection_counts()[("echo", "latency_downstream")] == slow


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
