"""reset_peer: reset connections on a link (TCP RST) after ``timeout_ms``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt

from chaos.faults.network import ToxicFault, ToxicParams
from chaos.faults.registry import register


class ResetPeerParams(ToxicParams):
    kind: Literal["reset_peer"]
    timeout_ms: StrictInt = Field(
        default=0, ge=0, description="reset after this many ms of the connection; 0 resets at once"
    )


@register("reset_peer")
class ResetPeer(ToxicFault):
    """Connections on the link are reset (RST, not FIN), like a peer that crashed."""

    params_model = ResetPeerParams
    toxic_type = "reset_peer"

    def attributes(self) -> dict[str, int]:
        return {"timeout": self.params.timeout_ms}
