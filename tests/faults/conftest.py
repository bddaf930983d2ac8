"""A real fault proxy (chaos.proxy, in a background event loop) and an echo upstream."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest

from chaos.proxy.client import ToxiproxyClient
from chaos.proxy.server import ProxyServer


class ProxyThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = ProxyServer("127.0.0.1", 0, seed=1)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class Echo:
    """TCP echo server on 127.0.0.1 (a thread per connection)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def proxy() -> Iterator[ToxiproxyClient]:
    server = ProxyThread()
    try:
        with ToxiproxyClient(server.server.url, timeout_s=5) as client:
            yield client
    finally:
        server.close()


@pytest.fixture
def echo() -> Iterator[Echo]:
    e = Echo()
    yield e
    e.close()
