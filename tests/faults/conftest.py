"""A real fault proxy (chaos.proxy, in a background event loop) and an echo upstream; the
reference stack's storage side (Redis, the proxy, LMCache with both L2 tiers) as processes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture(scope="module")
def reference_storage(tmp_path_factory):
    """compose/reference.yml started up to its ``lmcache`` service (Redis, the fault proxy,
    LMCache with the resp and fs L2 adapters), for one test module."""
    from chaos.stack.local import LocalStack

    repo = Path(__file__).resolve().parents[2]
    stack = LocalStack(repo / "compose/reference.yml", run_dir=tmp_path_factory.mktemp("storage") / "run",
                       environ=dict(os.environ))
    stack.up(["lmcache"])
    try:
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="module")
def pool(reference_pool):
    """The session's StackPool of local reference stacks (tests/conftest.py ``reference_pool``;
    a module using it is listed in REFERENCE_POOL_FILES there)."""
    return reference_pool
