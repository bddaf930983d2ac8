"""A real fault proxy (chaos.proxy, in a background event loop) and an echo upstream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chaos.proxy.client import ToxiproxyClient
from kvchaos_support import Upstream, echo as echo_handler, proxy_server


@pytest.fixture(params=["bundled", "real"])
def proxy(request: pytest.FixtureRequest) -> Iterator[ToxiproxyClient]:
    """A client of the bundled proxy and of the real Toxiproxy (each test runs against both)."""
    server = proxy_server("asyncio" if request.param == "bundled" else "real")
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
