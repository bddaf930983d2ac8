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

Every ``httpx.Client`` (and every ``httpx.get``, which builds one) also builds an SSL context by
default, loading the CA bundle: about 40 ms of CPU, against under 1 ms for the plain-HTTP request
itself (measured on the 2-core CI machine, httpx 0.29, 2026-12-07). kvchaos's health probes ran
hundreds of ``httpx.get`` per stack start-up, which made certificate loading the largest CPU cost
of the kvchaos process. :func:`ssl_context` is the one default context of the process, built once
and passed as ``verify=`` (an ``ssl.SSLContext`` is httpx's own form of ``verify``; the same
settings as the default ``verify=True``, so HTTPS is verified exactly as before).
"""

from __future__ import annotations

import ssl
import threading

import httpx

__all__ = ["KEEPALIVE_EXPIRY_S", "pool_limits", "ssl_context"]

#: Seconds an idle pooled connection is kept for reuse. Below uvicorn's default
#: ``timeout_keep_alive`` of 5 s (the engines' API servers) with a 4 s margin for a loaded
#: host, where the client's and the server's idle clocks start up to a scheduling delay apart.
KEEPALIVE_EXPIRY_S = 1.0


def pool_limits(max_connections: int | None = 100, max_keepalive_connections: int | None = 20) -> httpx.Limits:
    """``httpx.Limits`` for a kvchaos client pool: the given sizes (httpx's meaning and defaults;
    None is no bound) and ``keepalive_expiry=KEEPALIVE_EXPIRY_S`` seconds."""
    return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_keepalive_connections,
                        keepalive_expiry=KEEPALIVE_EXPIRY_S)


_SSL_CONTEXT: ssl.SSLContext | None = None
_SSL_LOCK = threading.Lock()


def ssl_context() -> ssl.SSLContext:
    """The process's default SSL context for httpx clients (``verify=ssl_context()``): what
    ``verify=True`` builds (``httpx.create_ssl_context()``: the CA bundle, the environment's
    ``SSL_CERT_FILE``/``SSL_CERT_DIR``), built on first use and shared (thread-safe), so a client
    costs no certificate loading (see the module doc)."""
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        with _SSL_LOCK:
            if _SSL_CONTEXT is None:
                _SSL_CONTEXT = httpx.create_ssl_context()
    return _SSL_CONTEXT
