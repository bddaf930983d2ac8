"""A real fault proxy (chaos.proxy, in a background event loop) and an echo upstream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chaos.proxy.client import ToxiproxyClient
from kvchaos_support import ServerThread, Upstream, echo as echo_handler


@pytest.fixture
def proxy() -> Iterator[ToxiproxyClient]:
    server = ServerThread()
    try:
        with ToxiproxyClient(server.url, timeout_s=5) as client:
            yield client
    finally:
        server.close()


@pytest.fixture
def echo() -> Iterator[Upstream]:
    e = Upstream(echo_handler)
    yield e
    e.close()
