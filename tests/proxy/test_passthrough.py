"""With no toxics the proxy is transparent: raw bytes, half-close, ZMQ and RESP (Redis)."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import threading
import time

import pytest


def test_random_bytes_both_ways_with_half_close(client, real, echo_upstream, net):
    if real:
        pytest.skip("the real server does not pass a half-close on (kept: tests/proxy/test_compat.py::test_half_close)")
    p = client.create_proxy("echo", "127.0.0.1:0", echo_upstream.address)
    payload = os.urandom(8 * 1024 * 1024 + 17)
    s = net.connect(p.listen, timeout=30)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(net.recv_all(s)))
    reader.start()
    s.sendall(payload)
    s.shutdown(socket.SHUT_WR)  # half-close: the echo still flows back, then EOF
    reader.join(30)
    s.close()
    assert hashlib.sha256(got[0]).digest() == hashlib.sha256(payload).digest()


def test_reply_after_client_half_close(client, real, net):
    if real:
        pytest.skip("the real server does not pass a half-close on (kept: tests/proxy/test_compat.py::test_half_close)")
    def reply_after_eof(conn: socket.socket) -> None:
        data = net.recv_all(conn)
        conn.sendall(b"got %d" % len(data))

    up = net.Upstream(reply_after_eof)
    p = client.create_proxy("hc", "127.0.0.1:0", up.address)
    s = net.connect(p.listen)
    s.sendall(b"x" * 1000)
    s.shutdown(socket.SHUT_WR)
    assert net.recv_all(s) == b"got 1000"
    s.close()
    up.close()


def test_upstream_refused_closes_client(client, net):
    dead = socket.create_server(("127.0.0.1", 0))
    addr = "127.0.0.1:%d" % dead.getsockname()[1]
    dead.close()
    p = client.create_proxy("dead", "127.0.0.1:0", addr)
    s = net.connect(p.listen)
    assert s.recv(1) == b""
    s.close()


def test_zmq_req_rep_through_proxy(client):
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    port = rep.bind_to_random_port("tcp://127.0.0.1")
    p = client.create_proxy("zmq", "127.0.0.1:0", f"127.0.0.1:{port}")
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.RCVTIMEO, 5000)
    req.connect(f"tcp://{p.listen}")
    try:
        for size in (0, 1, 255, 256, 70_000, 1 << 20):
            msg = [os.urandom(size), b"frame-2"]
            req.send_multipart(msg)
            assert rep.recv_multipart() == msg
            rep.send_multipart(list(reversed(msg)))
            assert req.recv_multipart() == list(reversed(msg))
    finally:
        req.close(0)
        rep.close(0)
        ctx.term()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server")
def test_redis_resp_through_proxy(client, tmp_path):
    redis = pytest.importorskip("redis")
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p = client.create_proxy("redis", "127.0.0.1:0", f"127.0.0.1:{port}")
        host, pport = p.listen.rsplit(":", 1)
        r = redis.Redis(host=host, port=int(pport), socket_timeout=5)
        deadline = time.time() + 10
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        blob = os.urandom(3 * 1024 * 1024)
        r.set(b"k\r\n*1", blob)
        assert r.get(b"k\r\n*1") == blob
        pipe = r.pipeline()
        for i in range(100):
            pipe.set(f"n{i}", i)
        pipe.execute()
        assert r.mget([f"n{i}" for i in range(100)]) == [str(i).encode() for i in range(100)]
        r.close()
    finally:
        proc.terminate()
        proc.wait(10)
