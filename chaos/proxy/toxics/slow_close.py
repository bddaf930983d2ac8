"""slow_close: hold the close (FIN) of the stream for ``delay`` milliseconds.

Toxiproxy 2.x ``toxics/slow_close.go``: data passes untouched; when the source closes, the
close reaches the destination only after ``delay``.
"""

from __future__ import annotations

from pydantic import Field

from chaos.proxy.toxics.toxic import Toxic, ToxicStub, register


@register
class SlowCloseToxic(Toxic):
    """Delays the TCP close by ``delay`` ms."""

    type_name = "slow_close"

    delay: int = Field(0, description="delay of the close in milliseconds")

    async def on_eof(self, stub: ToxicStub) -> None:
        stub.mark_acted()
        await stub.sleep(self.delay / 1000.0)
