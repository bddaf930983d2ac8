"""The splice(2) fast path: a direction with no toxics moves bytes socket -> pipe -> socket in
the kernel. Every byte arrives in order, a toxic added while the pipe still holds bytes sees them
delivered first, FIN and RST are passed on, and no descriptor outlives its connection."""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import threading
import time

import pytest


@pytest.fixture(autouse=True)
def _bundled_only(real):
    if real:
        pytest.skip("splice(2) is the bundled proxy's own fast path")

from chaos.proxy import link as link_module

pytestmark = pytest.mark.skipif(not link_module.SPLICE, reason="splice(2) is Linux-only")


def wait_for(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def connections(server, name: str) -> list:
    return list(server.server.collection.proxies[name].connections)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_both_directions_splice_and_keep_every_byte(server, client, net, echo_upstream):
    p = client.create_proxy("s", "127.0.0.1:0", echo_upstream.address)
    payload = os.urandom(1 << 20) * 24  # 24 MiB, echoed back
    sock = net.connect(p.listen, timeout=30)
    got = hashlib.sha256()
    count = [0]

    def read() -> None:
        while count[0] < len(payload) and (data := sock.recv(1 << 20)):
            got.update(data)
            count[0] += len(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sock.sendall(payload)
    reader.join(60)
    assert count[0] == len(payload)
    assert got.hexdigest() == hashlib.sha256(payload).hexdigest()
    (conn,) = connections(server, "s")
    assert conn.up.splicer is not None and conn.down.splicer is not None
    stats = server.server.collection.proxies["s"].stats
    assert stats.received["upstream"] == stats.sent["upstream"] == len(payload)
    sock.close()


def test_toxic_added_while_the_pipe_holds_bytes_gets_them_first(server, client, net):
    """The upstream stops reading, so the pipe fills; a latency toxic added then must write the
    pipe's bytes to the upstream before any byte read later, and lose none."""
    release = threading.Event()
    got = hashlib.sha256()
    count = [0]

    def slow_sink(conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        release.wait(30)
        while data := conn.recv(1 << 20):
            got.update(data)
            count[0] += len(data)

    up = net.Upstream(slow_sink)
    p = client.create_proxy("s", "127.0.0.1:0", up.address)
    sock = net.connect(p.listen, timeout=30)
    sent = hashlib.sha256()
    total = 0
    payload = os.urandom(256 * 1024)

    def send() -> None:
        nonlocal total
        for i in range(64):  # 16 MiB
            block = i.to_bytes(8, "big") + payload
            sock.sendall(block)
            sent.update(block)
            total += len(block)
        sock.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    wait_for(lambda: connections(server, "s"), what="the connection")
    (conn,) = connections(server, "s")
    wait_for(lambda: conn.up.splicer is not None and conn.up.splicer.in_pipe > 0
             and conn.up.splicer.writing, what="a full pipe waiting on the upstream")
    client.add_toxic("s", "latency", {"latency": 5}, stream="upstream")
    assert conn.up.splicer is None and not conn.up.fast
    release.set()
    sender.join(60)
    wait_for(lambda: count[0] == total and not sender.is_alive(), timeout=60, what="all bytes")
    assert got.hexdigest() == sent.hexdigest(), "bytes lost or reordered"
    up.close()


def test_half_close_is_passed_on_and_the_answer_comes_back(client, net):
    def answer_after_eof(conn: socket.socket) -> None:
        n = 0
        while data := conn.recv(65536):
            n += len(data)
        conn.sendall(struct.pack("!Q", n) + b"done")

    up = net.Upstream(answer_after_eof)
    p = client.create_proxy("s", "127.0.0.1:0", up.address)
    sock = net.connect(p.listen, timeout=30)
    sock.sendall(b"x" * 3_000_000)
    sock.shutdown(socket.SHUT_WR)
    reply = b""
    while data := sock.recv(65536):
        reply += data
    assert reply == struct.pack("!Q", 3_000_000) + b"done"
    sock.close()
    up.close()


def test_upstream_reset_closes_the_client_and_frees_every_descriptor(server, client, net):
    accepted = threading.Event()
    go = threading.Event()

    def reset_after_data(conn: socket.socket) -> None:
        conn.recv(65536)
        accepted.set()
        go.wait(10)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    up = net.Upstream(reset_after_data)
    p = client.create_proxy("s", "127.0.0.1:0", up.address)
    before = open_fds()
    socks = []
    for _ in range(5):
        s = net.connect(p.listen, timeout=30)
        s.sendall(b"hello")
        socks.append(s)
    wait_for(lambda: len(connections(server, "s")) == 5, what="five connections")
    assert accepted.wait(10)
    go.set()
    for s in socks:
        s.settimeout(10)
        try:
            assert s.recv(10) == b""
        except ConnectionResetError:
            pass
        s.close()
    wait_for(lambda: not connections(server, "s"), what="the proxy to drop the connections")
    # the sockets, the dup()s and the pipes of all five connections are gone
    wait_for(lambda: open_fds() <= before, what="descriptors to be closed")
    up.close()
