"""reset_peer: reset the connection (TCP RST) ``timeout`` ms after data arrives.

Toxiproxy 2.x ``toxics/reset_peer.go``: when data (or the close) reaches this stage, it is
dropped, and after ``timeout`` (0: at once) both sockets are closed with ``SO_LINGER`` 0, so
the kernel sends RST and the peers see ECONNRESET ("Connection reset by peer").
"""

from __future__ import annotations

from pydantic import Field

from chaos.proxy.toxics.toxic import Chunk, Emit, Toxic, ToxicStub, register


@register
class ResetPeerToxic(Toxic):
    """Resets the connection ``timeout`` ms after the first data."""

    type_name = "reset_peer"

    timeout: int = Field(0, description="time in milliseconds before the reset")

    async def pipe(self, stub: ToxicStub, chunk: Chunk, emit: Emit) -> None:
        await self._reset(stub)

    async def on_eof(self, stub: ToxicStub) -> None:
        await self._reset(stub)

    async def _reset(self, stub: ToxicStub) -> None:
        stub.mark_acted()
        if await stub.sleep(self.timeout / 1000.0):
            stub.link.connection.reset()
