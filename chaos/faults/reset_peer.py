"""reset_peer: reset connections on a link (TCP RST) ``timeout_ms`` after data reaches the toxic.

Toxiproxy 2.9.0 ``toxics/reset_peer.go``: the first chunk of a connection that reaches the toxic
is dropped, ``timeout_ms`` later the connection is reset; that wait cannot be interrupted, so a
reset whose delay has started happens even when the fault is healed first, and the removal
waits for it (the bundled proxy does the same). The heal therefore takes up to ``timeout_ms``.
Evidence without a per-toxic counter: bytes reached the toxic (each such connection is reset).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt

from chaos.faults.network import ToxicFault, ToxicParams
from chaos.faults.registry import register


class ResetPeerParams(ToxicParams):
    kind: Literal["reset_peer"]
    timeout_ms: StrictInt = Field(
        default=0, ge=0, description="reset this many ms after the connection's first data reaches the toxic; "
        "0 resets at once (a reset under way completes even when the fault is healed first)"
    )


@register("reset_peer")
class ResetPeer(ToxicFault):
    """Connections on the link are reset (RST, not FIN), like a peer that crashed."""

    params_model = ResetPeerParams
    toxic_type = "reset_peer"

    def attributes(self) -> dict[str, int]:
        return {"timeout": self.params.timeout_ms}

    def removal_timeout_s(self) -> float:
        """The removal answers once the resets under way are done: up to ``timeout_ms``."""
        return self.params.timeout_ms / 1000.0 + 10.0
