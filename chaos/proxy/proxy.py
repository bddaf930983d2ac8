"""One proxy: a listener that accepts clients and links each to a fresh upstream connection.

::

    client <-> [listen] proxy <-> upstream
                  |
                  +-- toxics: upstream chain, downstream chain (ToxicCollection)

Enabling binds the listen address (port 0: a free port, reported back in ``listen``);
disabling closes the listener and every open connection, so new clients are refused until
it is enabled again. Semantics follow Toxiproxy 2.x ``proxy.go``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random

from chaos.proxy import errors
from chaos.proxy.connection import ClientSide, Connection
from chaos.proxy.metrics import ProxyStats
from chaos.proxy.models import ProxyInfo
from chaos.proxy.toxic_collection import ToxicCollection

log = logging.getLogger(__name__)


def split_address(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` / ``"[v6]:port"`` into (host, port).

    Raises:
        ValueError: no port, or a port that is not an integer in 0..65535.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address!r} has no port (want host:port)")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"address {address!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"address {address!r}: port {port} is out of range")
    return host, port


def join_address(host: str, port: int) -> str:
    """Return ``host:port``, bracketing an IPv6 host like Go's ``net.JoinHostPort``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """True if ``host`` is ``localhost`` or a loopback IP address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _normal(listen: str) -> str:
    """``localhost:P`` -> ``127.0.0.1:P`` (Go resolves before comparing); else unchanged."""
    try:
        host, port = split_address(listen)
    except ValueError:
        return listen
    return join_address("127.0.0.1" if host == "localhost" else host, port)


class Proxy:
    """A named proxy from ``listen`` to ``upstream`` with its toxics and connections."""

    def __init__(self, name: str, listen: str, upstream: str, stats: ProxyStats,
                 rng: random.Random, allow_remote: bool = False) -> None:
        self.name = name
        self.listen = listen or "127.0.0.1:0"
        self.upstream = upstream
        self.enabled = False
        self.toxics = ToxicCollection(stats)
        self.connections: set[Connection] = set()
        self.stats = stats
        self.rng = rng
        self.allow_remote = allow_remote
        self._server: asyncio.Server | None = None
        stats.upstream = upstream
        self.check_listen(self.listen)

    def check_listen(self, listen: str) -> None:
        """Validate a listen address.

        Raises:
            ApiError: 400 if malformed, or off loopback without ``allow_remote``.
        """
        try:
            host, _ = split_address(listen)
        except ValueError as exc:
            raise errors.BAD_REQUEST_BODY.joined(str(exc)) from None
        if not self.allow_remote and not is_loopback(host):
            raise errors.REMOTE_LISTEN_REFUSED.joined(listen)

    def upstream_address(self) -> tuple[str, int]:
        """Return the upstream (host, port)."""
        return split_address(self.upstream)

    def info(self) -> ProxyInfo:
        """Return the API view of the proxy, toxics included."""
        return ProxyInfo(name=self.name, listen=self.listen, upstream=self.upstream,
                         enabled=self.enabled, toxics=[w.info() for w in self.toxics.all()])

    async def start(self) -> None:
        """Bind the listen address and accept clients; no-op if already enabled.

        Raises:
            ApiError: 500 with Go's wording if the address cannot be bound (e.g. in use),
                as Toxiproxy reports it.
        """
        if self.enabled:
            return
        host, port = split_address(self.listen)
        # One address, one socket: "localhost" would bind 127.0.0.1 and ::1 on two ports.
        host = {"localhost": "127.0.0.1", "": "0.0.0.0"}.get(host, host)
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(lambda: ClientSide(self), host, port,
                                              reuse_address=True, backlog=1024)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.errno == 98 or "in use" in reason.lower():
                reason = "address already in use"
            raise errors.ApiError(f"listen tcp {self.listen}: bind: {reason.lower()}",
                                  errors.LISTEN_FAILED_STATUS) from None
        sockname = server.sockets[0].getsockname()
        self.listen = join_address(sockname[0], sockname[1])
        self.stats.listen = self.listen
        self._server = server
        self.enabled = True
        log.info("proxy %s listening on %s -> %s", self.name, self.listen, self.upstream)

    def stop(self) -> None:
        """Stop listening and close every open connection (no-op if disabled)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        self.enabled = False
        for connection in list(self.connections):
            connection.close()

    def differs(self, listen: str, upstream: str) -> bool:
        """True if ``listen``/``upstream`` would change the proxy (Toxiproxy's Differs)."""
        return _normal(listen) != self.listen or upstream != self.upstream

    async def update(self, listen: str | None, upstream: str | None,
                     enabled: bool | None) -> None:
        """Apply ``PATCH /proxies/{name}``: a new address restarts the listener.

        Raises:
            ApiError: 400 bad listen address; 500 the new address cannot be bound.
        """
        listen = self.listen if listen is None else listen
        upstream = self.upstream if upstream is None else upstream
        enabled = self.enabled if enabled is None else enabled
        if listen != self.listen:
            self.check_listen(listen)
        if upstream != self.upstream:
            try:
                split_address(upstream)
            except ValueError as exc:
                raise errors.BAD_REQUEST_BODY.joined(str(exc)) from None
        if self.differs(listen, upstream):
            was_enabled = self.enabled
            self.stop()
            self.listen, self.upstream = listen, upstream
            self.stats.upstream = upstream
            if was_enabled and enabled:
                await self.start()
                return
        if enabled and not self.enabled:
            await self.start()
        elif not enabled and self.enabled:
            self.stop()
