"""latency: delay every chunk by ``latency`` +/- ``jitter`` milliseconds.

Semantics from Toxiproxy 2.x ``toxics/latency.go``: the delay counts from when the chunk was
read, so chunks queued behind a delayed one are not delayed twice; with jitter the delay is
drawn uniformly from [latency - jitter, latency + jitter).
"""

from __future__ import annotations

import asyncio

from pydantic import Field

from chaos.proxy.toxics.toxic import Chunk, Emit, Toxic, ToxicStub, register


@register
class LatencyToxic(Toxic):
    """Adds ``latency`` +/- ``jitter`` (ms) to all data going through the stream."""

    type_name = "latency"

    latency: int = Field(0, description="delay in milliseconds")
    jitter: int = Field(0, description="+/- variation of the delay in milliseconds")

    def delay_s(self, stub: ToxicStub) -> float:
        """Return this chunk's delay in seconds (jitter drawn from the link's seeded RNG)."""
        delay = self.latency
        if self.jitter > 0:
            delay += stub.link.rng.randrange(self.jitter * 2) - self.jitter
        return delay / 1000.0

    async def pipe(self, stub: ToxicStub, chunk: Chunk, emit: Emit) -> None:
        loop = asyncio.get_running_loop()
        wait = chunk.timestamp + self.delay_s(stub) - loop.time()
        # Interrupted (toxic removed/updated): pass the chunk on at once, never drop it.
        await stub.sleep(wait)
        chunk.timestamp = loop.time()
        await emit(chunk)
