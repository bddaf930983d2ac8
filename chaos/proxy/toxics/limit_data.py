"""limit_data: close the connection once ``bytes`` bytes have passed (a partial read).

Toxiproxy 2.x ``toxics/limit_data.go``: the stream carries exactly ``bytes`` bytes (counted
per connection and direction, from when the toxic was added), then the connection is closed.
"""

from __future__ import annotations

from pydantic import Field

from chaos.proxy.toxics.toxic import Chunk, Emit, Toxic, ToxicStub, register


class _Transmitted:
    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


@register
class LimitDataToxic(Toxic):
    """Closes the connection after ``bytes`` bytes."""

    type_name = "limit_data"
    acts_on_every_chunk = False

    bytes: int = Field(0, description="number of bytes to transmit before the close")

    def new_state(self) -> _Transmitted:
        return _Transmitted()

    async def pipe(self, stub: ToxicStub, chunk: Chunk, emit: Emit) -> None:
        sent: _Transmitted = stub.state
        remaining = max(0, self.bytes - sent.count)
        if remaining < len(chunk.data):
            stub.mark_acted()
            chunk = Chunk(chunk.data[:remaining], chunk.timestamp)
        if chunk.data:
            sent.count += len(chunk.data)
            await emit(chunk)
        if self.bytes - sent.count <= 0:
            stub.mark_acted()
            stub.link.connection.close()
