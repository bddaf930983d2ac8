"""timeout: stop all data and close the connection after ``timeout`` milliseconds.

Toxiproxy 2.x ``toxics/timeout.go``: data reaching this stage is dropped; after ``timeout`` the
connection is closed; ``timeout`` 0 holds it open (dropping data) until the toxic is removed.
As in Toxiproxy 2.9.0 (its loop makes a new ``time.After(timeout)`` for each chunk), the
``timeout`` counts from the toxic's start or the last chunk it dropped, whichever is later:
the connection is closed after ``timeout`` ms without data. Removing the toxic closes the
connections it held (Toxiproxy's ``Cleanup``): the bytes it dropped are gone, so the stream
could not be resumed intact anyway.
"""

from __future__ import annotations

from pydantic import Field

from chaos.proxy.toxics.toxic import Chunk, Emit, Toxic, ToxicStub, register


@register
class TimeoutToxic(Toxic):
    """Drops data; closes the connection after ``timeout`` ms (0: never, until removed)."""

    type_name = "timeout"

    timeout: int = Field(0, description="time in milliseconds before the close; 0 holds forever")

    def start(self, stub: ToxicStub) -> None:
        if self.timeout > 0:
            stub.call_later(self.timeout / 1000.0, lambda: _close(stub))

    async def pipe(self, stub: ToxicStub, chunk: Chunk, emit: Emit) -> None:
        stub.mark_acted()  # the data is dropped on the ground
        self.start(stub)  # the close comes ``timeout`` after the last chunk (Toxiproxy)

    async def on_eof(self, stub: ToxicStub) -> None:
        stub.mark_acted()
        stub.link.connection.close()

    def cleanup(self, stub: ToxicStub) -> None:
        if stub.active:
            stub.link.connection.close()


def _close(stub: ToxicStub) -> None:
    stub.mark_acted()
    stub.link.connection.close()
