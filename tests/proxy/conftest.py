"""Fixtures: a proxy server in a background event loop, and real TCP upstreams (threads)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from chaos.proxy.client import ToxiproxyClient
from chaos.proxy.server import ProxyServer


class ServerThread:
    """Runs a ProxyServer on its own event loop in a daemon thread."""

    def __init__(self, seed: int | None = 1, loop: str = "asyncio") -> None:
        if loop == "uvloop":
            uvloop = pytest.importorskip("uvloop")
            self.loop = uvloop.new_event_loop()
        else:
            self.loop = asyncio.new_event_loop()
        self.server = ProxyServer("127.0.0.1", 0, seed=seed)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start())

    def call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class Upstream:
    """A threaded TCP server on 127.0.0.1 running ``handler(conn)`` per connection."""

    def __init__(self, handler: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.handler = handler
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            self.handler(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


def echo(conn: socket.socket) -> None:
    """Echo every byte back until EOF."""
    while True:
        data = conn.recv(65536)
        if not data:
            return
        conn.sendall(data)


@pytest.fixture(params=["asyncio", "uvloop"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    """A running server on each event loop the CLI can pick (plain asyncio and uvloop)."""
    s = ServerThread(loop=request.param)
    yield s
    s.close()


@pytest.fixture
def client(server: ServerThread) -> Iterator[ToxiproxyClient]:
    with ToxiproxyClient(server.url, timeout_s=5) as c:
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
