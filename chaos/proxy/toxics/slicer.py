"""slicer: cut each chunk into pieces of about ``average_size`` bytes, ``delay`` µs apart.

Toxiproxy 2.x ``toxics/slicer.go``: a chunk is split in two around its middle (moved by up to
``size_variation`` bytes) until each piece is within ``size_variation`` of ``average_size``;
pieces are sent in order with ``delay`` microseconds between them. Unlike Toxiproxy (which
loops forever on ``average_size`` 0) we reject ``average_size`` < 1 and a ``size_variation``
not smaller than it, with HTTP 400.
"""

from __future__ import annotations

import random

from pydantic import Field, model_validator

from chaos.proxy.toxics.toxic import Chunk, Emit, Toxic, ToxicStub, register


@register
class SlicerToxic(Toxic):
    """Slices data into ~``average_size``-byte pieces with ``delay`` µs between them."""

    type_name = "slicer"

    average_size: int = Field(1, description="average piece size in bytes")
    size_variation: int = Field(0, description="+/- bytes of variation; < average_size")
    delay: int = Field(0, description="delay between pieces in microseconds")

    @model_validator(mode="after")
    def _sizes(self) -> SlicerToxic:
        if self.average_size < 1:
            raise ValueError("average_size must be at least 1 byte")
        if not 0 <= self.size_variation < self.average_size:
            raise ValueError("size_variation must be >= 0 and smaller than average_size")
        return self

    def offsets(self, size: int, rng: random.Random) -> list[int]:
        """Return the cut points ``[0, c1, ..., size]`` for a chunk of ``size`` bytes."""
        cuts = [0]
        stack = [(0, size)]
        while stack:  # depth-first, left piece first, so cuts come out in order
            start, end = stack.pop()
            if (end - start) - self.average_size <= self.size_variation:
                cuts.append(end)
                continue
            mid = start + (end - start) // 2
            if self.size_variation > 0:
                mid += rng.randrange(self.size_variation * 2) - self.size_variation
            stack.append((mid, end))
            stack.append((start, mid))
        return cuts

    async def pipe(self, stub: ToxicStub, chunk: Chunk, emit: Emit) -> None:
        data = memoryview(chunk.data)
        cuts = self.offsets(len(data), stub.link.rng)
        for i in range(1, len(cuts)):
            await emit(Chunk(bytes(data[cuts[i - 1]:cuts[i]]), chunk.timestamp))
            if i + 1 < len(cuts) and not await stub.sleep(self.delay / 1e6):
                # Removed or updated: send the remainder in one piece, in order.
                await emit(Chunk(bytes(data[cuts[i]:]), chunk.timestamp))
                return
