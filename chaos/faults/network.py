"""What network faults share: a link of the stack, a direction, and a toxic on the proxy.

    engine ──> [proxy listen] ══ toxic(s) ══> [upstream] LMCache
               a *link* of the stack (x-kvchaos.links), one Toxiproxy proxy per link

``downstream`` is data from the upstream server back to the client (Toxiproxy's default);
``upstream`` is data from the client to the server. Each toxic kind is its own module
(latency.py, timeout.py, ...) that only says which Toxiproxy type and attributes it maps to.

Evidence that a toxic bit, from the proxy side (the first source that can tell decides):

1. the bundled proxy's per-toxic counter ``toxiproxy_toxic_connections_total`` (connections the
   toxic acted on, its toxicity roll included);
2. otherwise (the real Toxiproxy has no per-toxic counter) the bytes that arrived on the toxic's
   stream while it was in place: the kernel's per-socket counts of the link's open connections
   (chaos/proxy/sockets.py), sampled right after the toxic was added and right before it is
   removed, plus, for connections that closed in between, Toxiproxy's own
   ``toxiproxy_proxy_received_bytes_total{proxy, direction}`` growth (it is added when a
   connection ends) minus what those connections had already read at the first sample. With
   ``toxicity`` below 1 bytes prove nothing (the real server does not say which connections its
   roll picked): the fault then reports that it cannot tell.

The system under test's own counters on the link's path (``x-kvchaos.links.<link>.effects``:
engine lookup timeouts and load failures, LMCache's failed L2 reads) are measured over the same
window and reported as ``effects``; they corroborate, but never make a fault bite on their own
(another fault in the same window may have caused them).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from typing import Any, ClassVar, Literal

from pydantic import Field

from chaos.faults.base import Fault, FaultContext, FaultParams

__all__ = ["LinkParams", "ToxicParams", "ToxicFault", "LinkWindow", "require_proxy", "acted_on", "received_bytes",
           "link_effects", "jsonable"]


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


def received_bytes(ctx: FaultContext, link: str, direction: str) -> int | None:
    """Toxiproxy's ``toxiproxy_proxy_received_bytes_total{proxy=link, direction}`` (bytes read
    from the source of that direction; the real server adds a connection's bytes when it ends),
    or None when the proxy has no ``/metrics`` (a real Toxiproxy serves it only with
    ``-proxy-metrics``). No sample yet reads 0: the real server exports the family only once a
    connection has ended."""
    from prometheus_client.parser import text_string_to_metric_families

    text = require_proxy(ctx).metrics_text()
    if text is None:
        return None
    total = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name == "toxiproxy_proxy_received_bytes_total" and sample.labels.get("proxy") == link
                    and sample.labels.get("direction") == direction):
                total += int(sample.value)
    return total


def link_effects(ctx: FaultContext, link: str) -> dict[str, float | None]:
    """The stack's ``x-kvchaos.links.<link>.effects`` counters now: ``{"<metric> @ <url>": value}``
    (None for a counter its endpoint does not export or an endpoint that does not answer)."""
    from chaos.prometheus import scrape_counters

    settings = getattr(ctx.stack, "settings", None)
    spec = getattr(settings, "links", {}).get(link) if settings is not None else None
    out: dict[str, float | None] = {}
    by_url: dict[str, list[str]] = {}
    for e in getattr(spec, "effects", None) or []:
        by_url.setdefault(e.url, []).append(e.metric)
    for url, names in by_url.items():
        try:
            got = scrape_counters(url, names, timeout_s=3.0)
        except Exception:  # an endpoint of the system under test down: nothing to say
            got = {n: None for n in names}
        for n in names:
            out[f"{n} @ {url}"] = got.get(n)
    return out


def _is_not_found(exc: Exception) -> bool:
    return getattr(exc, "status", None) == 404  # ToxiproxyError


def jsonable(obj: Any) -> Any:
    """The client's pydantic answer (Toxic/Proxy) as plain JSON data for the history."""
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json") if callable(dump) else obj


class LinkWindow:
    """What moved on a link while a fault was in place: kernel socket samples, Toxiproxy's
    byte counter and the system under test's effect counters, each taken at :meth:`open` (just
    after the fault is in place) and :meth:`close` (just before it is removed).

    Sampling never raises: what could not be measured is recorded with the reason.
    """

    def __init__(self, link: str) -> None:
        self.link = link
        self.listen: str | None = None
        self.upstream: str | None = None
        self.before: Any = None
        self.after: Any = None
        self.socket_error: str | None = None
        self.counter_before: dict[str, int | None] = {}
        self.counter_after: dict[str, int | None] = {}
        self.effects_before: dict[str, float | None] = {}
        self.effects_after: dict[str, float | None] = {}
        self.closed = False
        self.prior: Any = None
        self._t_prepare: float | None = None
        self._watch: Any = None
        self.destroyed: dict | None = None
        self.add_s: float | None = None

    def _addresses(self, ctx: FaultContext) -> None:
        if self.listen is None:
            p = jsonable(require_proxy(ctx).get_proxy(self.link))
            self.listen, self.upstream = p.get("listen"), p.get("upstream")

    def sample(self, ctx: FaultContext) -> Any:
        from chaos.proxy.sockets import SocketsUnavailable, sample_link

        try:
            self._addresses(ctx)
            pids = self.before.proxy_pids if self.before is not None else None
            return sample_link(str(self.listen), str(self.upstream), pids)
        except SocketsUnavailable as exc:
            self.socket_error = str(exc)
        except Exception as exc:  # the proxy API did not answer get_proxy
            self.socket_error = f"{type(exc).__name__}: {exc}"
        return None

    def _counters(self, ctx: FaultContext) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for d in ("upstream", "downstream"):
            try:
                out[d] = received_bytes(ctx, self.link, d)
            except Exception:
                out[d] = None
        return out

    def prepare(self, ctx: FaultContext) -> None:
        """Samples just before the fault is put in place: sockets, then Toxiproxy's at-close
        counters (a connection that ends in between is subtracted as if open: never
        over-counted). A connection that ends *while* the toxic is being added (the real server
        attaches it link by link under one lock; ``add_s`` in the evidence) is counted with the
        bytes it read after this sample: a cut during the add (limit_data meeting a transfer
        that started with the phase) is a bite the later samples alone would miss."""
        self.prior = self.sample(ctx)
        self.counter_before = self._counters(ctx)
        self._t_prepare = time.monotonic()
        if self.prior is not None:
            from chaos.proxy.sockets import DestroyWatch

            ports = [int(str(a).rpartition(":")[2]) for a in (self.listen, self.upstream)]
            self._watch = DestroyWatch(ports)

    def open(self, ctx: FaultContext) -> None:
        """Samples just after the fault is in place: the start of the window for open sockets."""
        if self._t_prepare is not None:
            self.add_s = round(time.monotonic() - self._t_prepare, 4)
        self.before = self.sample(ctx)
        if not self.counter_before:
            self.counter_before = self._counters(ctx)
        self.effects_before = link_effects(ctx, self.link)

    def close(self, ctx: FaultContext) -> None:
        """Last samples, in reverse order: counters, then sockets."""
        if self.closed:
            return
        self.effects_after = link_effects(ctx, self.link)
        self.counter_after = self._counters(ctx)
        self.after = self.sample(ctx) if self.before is not None else None
        if self._watch is not None:
            self.destroyed = self._watch.stop()
            self._watch = None
        self.closed = True

    def effects(self) -> dict[str, float]:
        """Growth of each effect counter over the window (only counters read at both ends)."""
        out = {}
        for k, v in self.effects_after.items():
            old = self.effects_before.get(k)
            if v is not None and old is not None:
                out[k] = v - old
        return out

    def stream(self, stream: str, ctx: FaultContext | None = None) -> dict[str, Any]:
        """Bytes that arrived on ``stream`` while the fault was in place (see the module doc);
        before :meth:`close`, up to now. ``{"bytes": None, "reason": ...}`` when unknown."""
        from chaos.proxy.sockets import destroyed_bytes, ended_read, stream_bytes

        after, counter_after = self.after, self.counter_after
        if not self.closed and ctx is not None and self.before is not None:
            counter_after = self._counters(ctx)
            after = self.sample(ctx)
        if self.before is None or after is None:
            return {"bytes": None, "reason": f"the link's sockets could not be read: {self.socket_error}"}
        out: dict[str, Any] = stream_bytes(self.before, after, stream)
        closed_bytes = 0
        c0, c1 = self.counter_before.get(stream), counter_after.get(stream)
        if c0 is not None and c1 is not None:
            # Added when a connection ends: the ended connections' bytes (those opened in the
            # window too, which no socket sample saw) less what they had read before the window.
            read_before = ended_read(self.prior, self.before, after, stream)
            closed_bytes = max(0, (c1 - c0) - read_before)
            out["ended_connections_bytes"] = closed_bytes
        cut_bytes = 0
        if self.destroyed:
            # Read by connections the kernel destroyed in the window, after their last sample.
            cut_bytes = destroyed_bytes(self.prior, self.before, after, stream, self.destroyed)
            out["destroyed_connections_bytes"] = cut_bytes
        # The two measure the same ended connections: take the larger, never their sum.
        out["bytes"] = out["bytes_in"] + max(closed_bytes, cut_bytes)
        if self.add_s is not None:
            out["add_s"] = self.add_s
        return out


class ToxicFault(Fault):
    """Apply = add the toxic named after the fault id; heal = remove it; evidence = the
    bundled proxy's per-toxic counter, else the bytes on the toxic's stream while it was in
    place (module doc)."""

    toxic_type: ClassVar[str]
    params: ToxicParams

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._baseline: int = 0
        self._last_count: int | None = None
        self._window = LinkWindow(params.link)  # type: ignore[attr-defined]

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
        self._window.prepare(ctx)
        try:
            try:
                toxic = add()
            except Exception as exc:
                # 409: a toxic of this name outlived an earlier, crashed run; ours replaces it.
                if getattr(exc, "status", None) != 409:
                    raise
                client.remove_toxic(self.params.link, self.id)
                toxic = add()
                replaced = True
        except BaseException:
            self._window.close(ctx)  # ends the destroy watch
            raise
        self._window.open(ctx)  # after the toxic is in place: only bytes it saw count
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
        self._window.close(ctx)  # before removal: only bytes the toxic saw count
        try:
            client.remove_toxic(self.params.link, self.id)
        except Exception as exc:
            if not _is_not_found(exc):
                raise
            return {"link": self.params.link, "toxic": self.id, "removed": False, "absent": True}
        return {"link": self.params.link, "toxic": self.id, "removed": True}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        counts = [c for c in (self._count(ctx), self._last_count) if c is not None]
        effects = self._window.effects()
        stream = self._window.stream(self.params.stream, ctx)
        if counts:
            n = max(counts) - self._baseline
            out: dict[str, Any] = {"bit": n > 0, "acted_on": n, "source": "toxic counter", "stream": stream}
            if effects:
                out["effects"] = effects
            return out
        out = {"bit": False, "acted_on": None, "stream": stream}
        if effects:
            out["effects"] = effects
        if stream.get("bytes") is None:
            out["reason"] = (f"the proxy reports no toxic counters and {stream['reason']}")
        elif self.params.toxicity < 1.0:
            out["reason"] = (f"toxicity {self.params.toxicity} < 1 and the proxy reports no toxic counters: "
                             "bytes on the stream do not show which connections the toxic acted on")
        elif stream["bytes"] > 0:
            out.update(bit=True, source="stream bytes")
        else:
            out["reason"] = (f"no bytes arrived on the {self.params.stream} stream of {self.params.link} "
                             "while the toxic was in place")
        return out
