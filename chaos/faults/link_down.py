"""link_down: take a link down (disable its proxy): open connections close, new ones are refused."""

from __future__ import annotations

import time
from typing import Any, Literal

from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams
from chaos.faults.network import LinkParams, LinkWindow, jsonable, on_lmcache_path, require_proxy
from chaos.faults.registry import register


#: How long after the disable a connection open before it may take to close (s).
CUT_WAIT_S = 2.0


class LinkDownParams(LinkParams):
    kind: Literal["link_down"]


@register("link_down")
class LinkDown(Fault):
    """Disable the link's proxy; heal enables it again.

    Evidence ("bit" = the outage met a connection): the proxy confirmed the link disabled, and
    the kernel saw it cut at least one connection of the link that was open when it went down
    (the link's accepted sockets just before the disable, gone within ``CUT_WAIT_S`` after it;
    chaos/proxy/sockets.py). A connection attempted while the link was down is refused by the
    kernel, which counts no refusal per port, so that case shows only in the system under test's
    ``effects`` (e.g. engine lookup errors) and does not count as a bite on its own. Works alike
    for the bundled and the real Toxiproxy.
    """

    params_model = LinkDownParams
    params: LinkDownParams

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """A request of the workload was in flight while the link was down."""
        return DefaultTrigger("requests_in_place", "a request of the workload was in flight while the link "
                              "was down")

    @classmethod
    def holds_lmcache_answers(cls, params: FaultParams) -> bool:
        """True on a link of LMCache's path: the engine's calls across it wait or fail."""
        return on_lmcache_path(params)

    def __init__(self, params: LinkDownParams) -> None:
        super().__init__(params)
        self._confirmed = False
        self._window = LinkWindow(params.link)
        self._cut: list[int] = []
        self._refusing: bool | None = None

    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        client = require_proxy(ctx)
        self._window.open(ctx)  # the connections that are about to be cut
        proxy = client.update_proxy(self.params.link, enabled=False)
        enabled = jsonable(proxy).get("enabled")
        self._confirmed = enabled is False
        before = self._window.before
        if self._confirmed and before is not None:
            # Cut by the disable: open just before it and gone just after (not later, when a
            # client may have closed its connection for reasons of its own).
            deadline = time.monotonic() + CUT_WAIT_S
            while True:
                now = self._window.sample(ctx)
                if now is None:
                    break
                self._cut = [ino for ino in before.accepted if ino not in now.accepted]
                self._refusing = not now.listening
                if len(self._cut) == len(before.accepted) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        return {"link": self.params.link, "enabled": enabled}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        self._window.close(ctx)
        proxy = require_proxy(ctx).update_proxy(self.params.link, enabled=True)
        enabled = jsonable(proxy).get("enabled")
        return {"link": self.params.link, "enabled": enabled}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        w = self._window
        out: dict[str, Any] = {"bit": False, "disabled": self._confirmed}
        if w.effects():
            out["effects"] = w.effects()
        if not self._confirmed:
            out["reason"] = "the proxy did not confirm the link disabled"
            return out
        if w.before is None:
            out["reason"] = f"the link's sockets could not be read: {w.socket_error}"
            return out
        out.update(connections_open_at_apply=len(w.before.accepted), connections_cut=len(self._cut),
                   refusing=self._refusing)
        if self._cut:
            out["bit"] = True
            out["source"] = "connections cut"
        else:
            out["reason"] = f"no connection of {self.params.link} was open when it went down"
        return out
