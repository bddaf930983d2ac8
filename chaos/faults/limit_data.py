"""limit_data: close a connection once ``bytes`` bytes have passed (a transfer cut short)."""

from __future__ import annotations

from typing import Literal

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
