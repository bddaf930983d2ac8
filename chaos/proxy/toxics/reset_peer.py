"""reset_peer: reset the connection (TCP RST) ``timeout`` ms after data arrives.

Toxiproxy 2.x ``toxics/reset_peer.go``: when data (or the close) reaches this stage, it is
dropped, and after ``timeout`` (0: at once) both sockets are closed with ``SO_LINGER`` 0, so
the kernel sends RST and the peers see ECONNRESET ("Connection reset by peer").

As in Toxiproxy 2.9.0, whose wait (``<-time.After(timeout)``) cannot be interrupted, a reset
whose delay has started happens even when the toxic is removed first, and the removal
(``DELETE .../toxics/NAME``, ``POST /reset``) answers only once every such reset is done
(:attr:`ToxicWrapper.pending`): a fault healed before its delay ran out still resets the
connections its data reached, on both servers, and the heal waits for it.
"""

from __future__ import annotations

import asyncio

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
        connection = stub.link.connection
        if self.timeout <= 0:
            connection.reset()
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def fire() -> None:
            connection.reset()  # also when the toxic was removed meanwhile (Toxiproxy's wait)
            if not done.done():
                done.set_result(None)

        loop.call_later(self.timeout / 1000.0, fire)
        pending = stub.wrapper.pending
        pending.add(done)
        done.add_done_callback(pending.discard)
        await asyncio.shield(done)
