"""Fixtures: a proxy server in a background event loop, and real TCP upstreams (threads)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from chaos.proxy.client import ToxiproxyClient
from kvchaos_support import ServerThread, Upstream, echo, proxy_server


@pytest.fixture(params=["asyncio", "uvloop", "real"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    """A running server: the bundled proxy on each event loop the CLI can pick (plain asyncio
    and uvloop), and the real Toxiproxy (the differential half: the same API and data-plane
    tests against both servers; skipped only where no toxiproxy-server binary is found)."""
    s = proxy_server(request.param)
    yield s
    s.close()


@pytest.fixture
def real(request: pytest.FixtureRequest) -> bool:
    """True when the test runs against the real Toxiproxy."""
    return getattr(request.node, "callspec", None) is not None and request.node.callspec.params.get("server") == "real"


@pytest.fixture
def client(server: ServerThread) -> Iterator[ToxiproxyClient]:
    with ToxiproxyClient(server.url, timeout_s=60) as c:
        yield c


@pytest.fixture
def echo_upstream() -> Iterator[Upstream]:
    u = Upstream(echo)
    yield u
    u.close()


def connect(listen: str, timeout: float = 5.0) -> socket.socket:
    host, port = listen.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        data = sock.recv(n - len(buf))
        if not data:
            break
        buf += data
    return bytes(buf)


def recv_all(sock: socket.socket) -> bytes:
    buf = bytearray()
    while True:
        data = sock.recv(65536)
        if not data:
            return bytes(buf)
        buf += data


class Net:
    """Socket helpers for tests (a fixture, since test modules cannot import conftest)."""

    Upstream = Upstream
    ServerThread = ServerThread
    connect = staticmethod(connect)
    recv_exact = staticmethod(recv_exact)
    recv_all = staticmethod(recv_all)
    echo = staticmethod(echo)


@pytest.fixture
def net() -> type[Net]:
    return Net
