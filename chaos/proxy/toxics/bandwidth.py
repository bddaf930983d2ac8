"""bandwidth: cap the stream at ``rate`` KB/s (1 KB = 1000 bytes, as in Toxiproxy).

Toxiproxy 2.x ``toxics/bandwidth.go`` computes a chunk's sleep as ``len * 1ms / rate``, i.e.
``rate`` kilobytes (10^3 bytes) per second, and splits chunks larger than 100 ms worth of data
so that a slow rate trickles instead of stalling. ``rate <= 0`` means unlimited.
"""

from __future__ import annotations

import asyncio

from pydantic import Field

from chaos.proxy.toxics.toxic import Chunk, Emit, Toxic, ToxicStub, register

_SLICE_S = 0.1  # send at most 100 ms worth of data per write (bandwidth.go)


class _Pacer:
    """Per-connection pacing clock: the loop time at which the link may send next."""

    __slots__ = ("next_send",)

    def __init__(self) -> None:
        self.next_send = 0.0


@register
class BandwidthToxic(Toxic):
    """Limits the stream to ``rate`` KB/s."""

    type_name = "bandwidth"

    rate: int = Field(0, description="rate in KB/s (1000 bytes per second); <= 0 is unlimited")

    def new_state(self) -> _Pacer:
        return _Pacer()

    async def pipe(self, stub: ToxicStub, chunk: Chunk, emit: Emit) -> None:
        if self.rate <= 0:
            await emit(chunk)
            return
        loop = asyncio.get_running_loop()
        pacer: _Pacer = stub.state
        bytes_per_s = self.rate * 1000.0
        slice_size = max(1, int(bytes_per_s * _SLICE_S))
        data = memoryview(chunk.data)
        while data:
            piece, data = data[:slice_size], data[slice_size:]
            now = loop.time()
            # An idle link earns no credit: pacing restarts from now.
            pacer.next_send = max(pacer.next_send, now) + len(piece) / bytes_per_s
            if not await stub.sleep(pacer.next_send - now):
                # Removed or updated mid-chunk: flush the rest unpaced, in order.
                await emit(Chunk(bytes(piece) + bytes(data), loop.time()))
                return
            await emit(Chunk(bytes(piece), loop.time()))
