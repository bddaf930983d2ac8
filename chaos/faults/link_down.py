"""link_down: take a link down (disable its proxy): open connections close, new ones are refused."""

from __future__ import annotations

from typing import Any, Literal

from chaos.faults.base import Fault, FaultContext
from chaos.faults.network import LinkParams, jsonable, require_proxy
from chaos.faults.registry import register


class LinkDownParams(LinkParams):
    kind: Literal["link_down"]


@register("link_down")
class LinkDown(Fault):
    """Disable the link's proxy; heal enables it again.

    Evidence: the proxy confirmed the link disabled. A disabled Toxiproxy proxy closes every
    open connection and refuses new ones, so with a live engine↔LMCache connection (the engine
    keeps one open) the link going down bites by itself.
    """

    params_model = LinkDownParams
    params: LinkDownParams

    def __init__(self, params: LinkDownParams) -> None:
        super().__init__(params)
        self._confirmed = False

    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        proxy = require_proxy(ctx).update_proxy(self.params.link, enabled=False)
        enabled = jsonable(proxy).get("enabled")
        self._confirmed = enabled is False
        return {"link": self.params.link, "enabled": enabled}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        proxy = require_proxy(ctx).update_proxy(self.params.link, enabled=True)
        enabled = jsonable(proxy).get("enabled")
        return {"link": self.params.link, "enabled": enabled}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        return {"bit": self._confirmed, "disabled": self._confirmed}
