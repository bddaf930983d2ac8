"""timeout: stop all data on a link; close the connection after ``timeout_ms`` (0: never)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt

from chaos.faults.network import ToxicFault, ToxicParams
from chaos.faults.registry import register


class TimeoutParams(ToxicParams):
    kind: Literal["timeout"]
    timeout_ms: StrictInt = Field(
        default=0, ge=0, description="close the connection after this many ms; 0 holds data until healed"
    )


@register("timeout")
class Timeout(ToxicFault):
    """A black hole: data is dropped, the connection is closed after ``timeout_ms`` (if > 0)."""

    params_model = TimeoutParams
    toxic_type = "timeout"

    def attributes(self) -> dict[str, int]:
        return {"timeout": self.params.timeout_ms}
