"""What network faults share: a link of the stack, a direction, and a toxic on the proxy.

    engine ──> [proxy listen] ══ toxic(s) ══> [upstream] LMCache
               a *link* of the stack (x-kvchaos.links), one Toxiproxy proxy per link

``downstream`` is data from the upstream server back to the client (Toxiproxy's default);
``upstream`` is data from the client to the server. Each toxic kind is its own module
(latency.py, timeout.py, ...) that only says which Toxiproxy type and attributes it maps to.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar, Literal

from pydantic import Field

from chaos.faults.base import Fault, FaultContext, FaultParams

__all__ = ["LinkParams", "ToxicParams", "ToxicFault", "require_proxy", "acted_on", "jsonable"]


class LinkParams(FaultParams):
    """A fault on one link of the stack."""

    link: str = Field(
        min_length=1, description="name of a link in the stack's x-kvchaos.links (e.g. engine-lmcache)"
    )

    def stack_refs(self) -> dict[str, str]:
        return {"link": self.link}


class ToxicParams(LinkParams):
    """A fault that is one Toxiproxy toxic on a link."""

    stream: Literal["upstream", "downstream"] = Field(
        default="downstream",
        description="direction: downstream = server to client (responses), upstream = client to server",
    )
    toxicity: float = Field(
        default=1.0, ge=0.0, le=1.0, description="fraction of connections the toxic acts on, 0..1"
    )


def require_proxy(ctx: FaultContext) -> Any:
    """The context's Toxiproxy client. Raises RuntimeError when the stack has no proxy."""
    if ctx.proxy is None:
        raise RuntimeError("network faults need the stack's proxy (x-kvchaos.proxy); none is set")
    return ctx.proxy


def acted_on(ctx: FaultContext, link: str, toxic: str) -> int | None:
    """Connections the toxic ``toxic`` on proxy ``link`` has acted on so far (from the proxy's
    ``/metrics``), or None when the proxy exports no per-toxic counter (the real Toxiproxy)."""
    from chaos.proxy.client import TOXIC_METRIC, parse_toxic_connections

    text = require_proxy(ctx).metrics_text()
    # The family is exported even before any toxic acted; its absence means "not reported".
    if text is None or TOXIC_METRIC not in text:
        return None
    return int(parse_toxic_connections(text).get((link, toxic), 0))


def _is_not_found(exc: Exception) -> bool:
    return getattr(exc, "status", None) == 404  # ToxiproxyError


def jsonable(obj: Any) -> Any:
    """The client's pydantic answer (Toxic/Proxy) as plain JSON data for the history."""
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json") if callable(dump) else obj


class ToxicFault(Fault):
    """Apply = add the toxic named after the fault id; heal = remove it; evidence = the
    proxy's count of connections the toxic acted on, since apply."""

    toxic_type: ClassVar[str]
    params: ToxicParams

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._baseline: int = 0
        self._last_count: int | None = None

    @abstractmethod
    def attributes(self) -> dict[str, int]:
        """The Toxiproxy ``attributes`` of the toxic (JSON names, integer values)."""

    def _count(self, ctx: FaultContext) -> int | None:
        try:
            return acted_on(ctx, self.params.link, self.id)
        except Exception:  # evidence is best effort; the evidence check reports unknown
            return None

    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        client = require_proxy(ctx)
        # Counters are per toxic name and may survive an earlier run on the same proxy.
        before = self._count(ctx)
        self._baseline = before or 0

        def add() -> Any:
            return client.add_toxic(
                self.params.link,
                self.toxic_type,
                self.attributes(),
                stream=self.params.stream,
                toxicity=self.params.toxicity,
                name=self.id,
            )

        replaced = False
        try:
            toxic = add()
        except Exception as exc:
            # 409: a toxic of this name outlived an earlier, crashed run; ours replaces it.
            if getattr(exc, "status", None) != 409:
                raise
            client.remove_toxic(self.params.link, self.id)
            toxic = add()
            replaced = True
        return {
            "link": self.params.link,
            "toxic": self.id,
            "type": self.toxic_type,
            "stream": self.params.stream,
            "toxicity": self.params.toxicity,
            "attributes": self.attributes(),
            "proxy": jsonable(toxic),
            "replaced_stale_toxic": replaced,
        }

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        client = require_proxy(ctx)
        count = self._count(ctx)  # read before removal, in case removal drops the counter
        if count is not None:
            self._last_count = count
        try:
            client.remove_toxic(self.params.link, self.id)
        except Exception as exc:
            if not _is_not_found(exc):
                raise
            return {"link": self.params.link, "toxic": self.id, "removed": False, "absent": True}
        return {"link": self.params.link, "toxic": self.id, "removed": True}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        counts = [c for c in (self._count(ctx), self._last_count) if c is not None]
        if not counts:
            return {"bit": False, "acted_on": None, "reason": "the proxy reports no toxic counters"}
        n = max(counts) - self._baseline
        return {"bit": n > 0, "acted_on": n}
