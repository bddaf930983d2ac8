"""A proxied TCP connection: the client socket, the upstream socket, and a link each way.

::

    client <-> ClientSide ==upstream link==>  UpstreamSide <-> upstream server
                          <==downstream link==

Accepting a client pauses its reads until the upstream connection is open (or closes the
client if the upstream refuses, as Toxiproxy does). Each side's protocol forwards reads into
the link that starts there and write-buffer pressure into the link that ends there. A
half-close (FIN) is passed on to the other socket; the connection is torn down once both
directions have finished, when either socket fails, or when a toxic closes or resets it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import TYPE_CHECKING

from chaos.proxy.link import ToxicLink

if TYPE_CHECKING:
    from chaos.proxy.proxy import Proxy

log = logging.getLogger(__name__)

# SO_LINGER {on, 0 s}: close() discards unsent data and sends RST (reset_peer, per Toxiproxy's
# use of SetLinger(0) in link.go).
_LINGER_RST = struct.pack("ii", 1, 0)


class Connection:
    """Both sockets and both links of one client connection through a proxy."""

    def __init__(self, proxy: Proxy, client: asyncio.Transport) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: asyncio.Transport | None = None
        self.closed = False
        self.opener: asyncio.Task[None] | None = None
        collection = proxy.toxics
        self.up = ToxicLink(self, "upstream", collection.chain("upstream"), proxy.stats, proxy.rng)
        self.down = ToxicLink(
            self, "downstream", collection.chain("downstream"), proxy.stats, proxy.rng
        )
        proxy.stats.connections_total += 1
        proxy.stats.open_connections += 1
        proxy.connections.add(self)
        collection.links.add(self.up)
        collection.links.add(self.down)

    async def open_upstream(self) -> None:
        """Connect to the proxy's upstream; start both links or close the client."""
        loop = asyncio.get_running_loop()
        host, port = self.proxy.upstream_address()
        try:
            transport, _ = await loop.create_connection(lambda: UpstreamSide(self), host, port)
        except OSError as exc:
            log.warning("proxy %s: upstream %s refused: %s", self.proxy.name,
                        self.proxy.upstream, exc)
            self.close()
            return
        if self.closed:
            transport.close()
            return
        self.upstream = transport
        self.up.attach(self.client, transport)
        self.down.attach(transport, self.client)
        self.up.start_reading()

    def link_done(self) -> None:
        """A link passed its FIN on; close when both directions have finished."""
        if self.up.done and self.down.done:
            self.close()

    def close(self) -> None:
        """Close both sockets (pending writes are flushed first, then FIN)."""
        if self.closed:
            return
        self._teardown()
        self.client.close()
        if self.upstream is not None:
            self.upstream.close()

    def abort(self) -> None:
        """Close both sockets at once, dropping unsent data."""
        if not self.closed:
            self._teardown()
        self.client.abort()
        if self.upstream is not None:
            self.upstream.abort()

    def reset(self) -> None:
        """Reset both sockets: SO_LINGER 0 then close, so each peer gets RST (ECONNRESET)."""
        for transport in (self.client, self.upstream):
            sock = transport.get_extra_info("socket") if transport is not None else None
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
                except OSError:
                    pass
        self.abort()

    def _teardown(self) -> None:
        self.closed = True
        self.proxy.stats.open_connections -= 1
        self.up.close()
        self.down.close()
        self.proxy.connections.discard(self)
        self.proxy.toxics.links.discard(self.up)
        self.proxy.toxics.links.discard(self.down)


class _Side(asyncio.Protocol):
    """Protocol for one socket: reads go to ``reads_into``, pressure to ``writes_from``."""

    def __init__(self, connection: Connection, reads_into: ToxicLink, writes_from: ToxicLink):
        self.connection = connection
        self.feed = reads_into.feed
        self.reads_into = reads_into
        self.writes_from = writes_from

    def data_received(self, data: bytes) -> None:
        self.feed(data)

    def eof_received(self) -> bool:
        self.reads_into.feed_eof()
        return True  # keep the socket open for the other direction

    def pause_writing(self) -> None:
        self.writes_from.pause_dest()

    def resume_writing(self) -> None:
        self.writes_from.resume_dest()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection.close()


class ClientSide(_Side):
    """The accepted client socket: reads feed the upstream link."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:

        self.transport = transport  # type: ignore[assignment]
        transport.pause_reading()  # until the upstream is connected
        connection = Connection(self.proxy, transport)
        super().__init__(connection, connection.up, connection.down)
        # Keep a reference: the loop holds tasks only weakly.
        connection.opener = asyncio.get_running_loop().create_task(connection.open_upstream())


class UpstreamSide(_Side):
    """The socket to the upstream server: reads feed the downstream link."""

    def __init__(self, connection: Connection) -> None:
        super().__init__(connection, connection.down, connection.up)
