"""Connection pooling of kvchaos's HTTP clients (the workload, trigger probes, leak samplers).

A pooled HTTP/1.1 connection that sat idle can be closed by the server at the very moment the
client sends the next request on it: the request then fails with ``httpx.ReadError`` (or
``RemoteProtocolError``, "Server disconnected") though the server never saw it. Uvicorn, which
serves vLLM's OpenAI API and the reference engine, closes a connection idle for
``timeout_keep_alive`` = 5 s by default (uvicorn ``Config``; vLLM's api_server passes
``TIMEOUT_KEEP_ALIVE = 5``); httpx's own ``keepalive_expiry`` default is also 5 s, so a client
whose requests are about 5 s apart (a settle phase between two phases) races the server's
close: under load the race is lost now and then, and the workload recorded a liveness failure
the engine never caused (lookup-timeout under two concurrent stacks, 2026-12-03).

The rule is the usual one: the client's idle expiry stays well below the server's
(``KEEPALIVE_EXPIRY_S`` against 5 s), so the client drops an idle connection before the server
can, and a new request after a pause opens a new connection (one loopback connect, well under
a millisecond).
"""

from __future__ import annotations

import httpx

__all__ = ["KEEPALIVE_EXPIRY_S", "pool_limits"]

#: Seconds an idle pooled connection is kept for reuse. Below uvicorn's default
#: ``timeout_keep_alive`` of 5 s (the engines' API servers) with a 4 s margin for a loaded
#: host, where the client's and the server's idle clocks start up to a scheduling delay apart.
KEEPALIVE_EXPIRY_S = 1.0


def pool_limits(max_connections: int | None = 100, max_keepalive_connections: int | None = 20) -> httpx.Limits:
    """``httpx.Limits`` for a kvchaos client pool: the given sizes (httpx's meaning and defaults;
    None is no bound) and ``keepalive_expiry=KEEPALIVE_EXPIRY_S`` seconds."""
    return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_keepalive_connections,
                        keepalive_expiry=KEEPALIVE_EXPIRY_S)
