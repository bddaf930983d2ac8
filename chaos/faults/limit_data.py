"""limit_data: close a connection once ``bytes`` bytes have passed (a transfer cut short)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictInt

from chaos.faults.network import ToxicFault, ToxicParams
from chaos.faults.registry import register


class LimitDataParams(ToxicParams):
    kind: Literal["limit_data"]
    bytes: StrictInt = Field(ge=0, description="bytes let through per connection before it is closed")


@register("limit_data")
class LimitData(ToxicFault):
    """Each connection carries at most ``bytes`` bytes in the chosen stream, then closes."""

    params_model = LimitDataParams
    toxic_type = "limit_data"

    def attributes(self) -> dict[str, int]:
        return {"bytes": self.params.bytes}

    def decide(self, stream: dict[str, Any]) -> tuple[bool, str | None]:
        """Bit only when it cut a connection: one that ended in the window after the proxy read
        at least ``bytes`` from it there (Toxiproxy 2.9.0 ``limit_data.go`` counts a
        connection's bytes from the toxic's add and closes it at the limit; bytes that passed
        under the limit are not a bite)."""
        limit = self.params.bytes
        conns = stream.get("connections") or []
        if any(c["ended"] and c["read"] is not None and c["read"] >= limit for c in conns):
            return True, None
        unknown = [c for c in conns if c["ended"] and c["read"] is None]
        if unknown or (stream.get("ended_connections_bytes") or 0) >= max(limit, 1):
            # Ended connections whose bytes in the window are known only in sum (no destroy
            # record): one of them may have been cut, or none.
            return False, (f"connections of {self.params.link} ended in the window, but how many bytes each "
                           f"read there is not known (no record of the kernel's destroyed sockets): cannot "
                           f"tell whether one reached the {limit}-byte cut")
        return False, (f"no connection of {self.params.link} was cut: none that ended in the window had read "
                       f"{limit} bytes on the {self.params.stream} stream there")
