"""timeout: stop all data on a link; close the connection after ``timeout_ms`` (0: never)."""

from __future__ import annotations

from typing import Any, Literal

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

    def decide(self, stream: dict[str, Any]) -> tuple[bool, str | None]:
        """Bit when bytes reached it (it dropped them), or, with ``timeout_ms`` > 0, when it
        closed a connection open at its start after ``timeout_ms`` without data (Toxiproxy 2.9.0
        ``timeout.go`` closes a connection that long after its last chunk): a connection the
        kernel destroyed at least ``timeout_ms`` after the toxic was in place."""
        if stream["bytes"] > 0:
            return True, None
        t_open = self._window.t_open
        if self.params.timeout_ms > 0 and t_open is not None and not stream.get("held_by"):
            due = t_open + self.params.timeout_ms / 1000.0 - 0.05  # 50 ms: the add's own time
            if any(c["ended"] and not c["opened"] and c["ended_at"] is not None and c["ended_at"] >= due
                   for c in stream.get("connections") or []):
                return True, None
        return super().decide(stream)
