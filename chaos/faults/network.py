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
   roll picked): the fault then reports that it cannot tell. "Arrived" means read by the
   proxy (``bytes_read``: what the kernel received less what still waits in the socket), so
   only bytes that entered the proxy's toxic chain count. What the bytes prove depends on the
   kind (:meth:`ToxicFault.decide`): ``latency``/``slicer``/``bandwidth`` acted on them;
   ``timeout`` dropped them, or closed a connection after ``timeout_ms`` without data;
   ``reset_peer`` resets the connection they came on (``timeout_ms`` after them; the heal waits
   for it, on both servers); ``limit_data`` bit only when a connection that read at least
   ``bytes`` in the window was cut.

Toxics of one stream form a chain in the order they were added (Toxiproxy's ``ToxicCollection``:
a new toxic is appended). A ``timeout`` or ``reset_peer`` earlier in the chain keeps every byte
from the toxics after it (dropped, or held until the reset), so the bytes a later toxic saw are
only those read while no such toxic was in place: its window starts again when the last of them
is removed (:func:`blocker_removed`), and a window they covered whole saw nothing.

The system under test's own counters on the link's path (``x-kvchaos.links.<link>.effects``:
engine lookup timeouts and load failures, LMCache's failed L2 reads) are measured over the same
window and reported as ``effects``; they corroborate, but never make a fault bite on their own
(another fault in the same window may have caused them).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import asdict
from typing import Any, ClassVar, Literal

from pydantic import Field

from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams

__all__ = ["LinkParams", "ToxicParams", "ToxicFault", "LinkWindow", "on_lmcache_path", "require_proxy", "acted_on", "received_bytes",
           "link_effects", "jsonable", "BLOCKING_TOXICS", "blocker_removed"]

#: Toxic types that keep data from the toxics after them in the chain (Toxiproxy 2.9.0:
#: ``timeout.go`` drops it; ``reset_peer.go`` drops the first chunk and reads no more until
#: its reset).
BLOCKING_TOXICS = frozenset({"timeout", "reset_peer"})

#: Open windows that wait for a blocking toxic earlier in their chain to be removed:
#: ``(proxy API url, link, stream)`` -> windows.
_BLOCKED: dict[tuple[str, str, str], list["LinkWindow"]] = {}


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


def on_lmcache_path(params: FaultParams) -> bool:
    """Whether the link ``params`` names is on the engine's path to LMCache or its L2 tiers: the
    stacks name those links after LMCache (``engine-lmcache``, ``lmcache-redis``; compose/*.yml
    ``x-kvchaos.links``)."""
    return "lmcache" in str(getattr(params, "link", ""))


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
        self.destroyed_at: dict | None = None
        self.add_s: float | None = None
        self.t_open: float | None = None
        # Blocking toxics before this one in its chain at open (names), those not removed yet,
        # and the samples taken when the last was removed (the window's new start).
        self.stream_name: str | None = None
        self.toxic_name: str | None = None
        self.blocked_by: list[str] = []
        self._blocking: set[str] = set()
        self._key: tuple[str, str, str] | None = None
        self.resumed: tuple[Any, dict[str, int | None], float] | None = None

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
        self.t_open = time.monotonic()  # the toxic is in place from (at the latest) here
        if self._t_prepare is not None:
            self.add_s = round(self.t_open - self._t_prepare, 4)
        self.before = self.sample(ctx)
        if not self.counter_before:
            self.counter_before = self._counters(ctx)
        self.effects_before = link_effects(ctx, self.link)

    def watch_chain(self, ctx: FaultContext, stream: str, toxic: str) -> None:
        """Note the blocking toxics (:data:`BLOCKING_TOXICS`) before ``toxic`` in the chain of
        ``stream`` (the proxy lists a stream's toxics in chain order); until the last of them
        is removed, no byte reaches this toxic."""
        self.stream_name, self.toxic_name = stream, toxic
        try:
            toxics = [t for t in (jsonable(require_proxy(ctx).get_proxy(self.link)).get("toxics") or [])
                      if t.get("stream", "downstream") == stream]
        except Exception:  # the proxy did not answer: counted as no blocker (the sockets say)
            return
        names = [t.get("name") for t in toxics]
        if toxic not in names:
            return
        self.blocked_by = [t["name"] for t in toxics[:names.index(toxic)] if t.get("type") in BLOCKING_TOXICS]
        if self.blocked_by:
            self._blocking = set(self.blocked_by)
            self._key = (require_proxy(ctx).url, self.link, stream)
            _BLOCKED.setdefault(self._key, []).append(self)

    def unblock(self, ctx: FaultContext, toxic: str) -> None:
        """The blocking toxic ``toxic`` was removed: when it was the last one before this
        toxic, sample now (the bytes this toxic can see start here)."""
        if self.closed or toxic not in self._blocking:
            return
        self._blocking.discard(toxic)
        if not self._blocking and self.before is not None:
            self.resumed = (self.sample(ctx), self._counters(ctx), time.monotonic())

    def close(self, ctx: FaultContext) -> None:
        """Last samples, in reverse order: counters, then sockets."""
        if self.closed:
            return
        self.effects_after = link_effects(ctx, self.link)
        self.counter_after = self._counters(ctx)
        self.after = self.sample(ctx) if self.before is not None else None
        if self._watch is not None:
            self.destroyed = self._watch.stop()
            self.destroyed_at = self._watch.destroyed_at
            self._watch = None
        self.closed = True
        if self._key is not None and self in _BLOCKED.get(self._key, []):
            _BLOCKED[self._key].remove(self)
            if not _BLOCKED[self._key]:
                del _BLOCKED[self._key]

    def effects(self) -> dict[str, float]:
        """Growth of each effect counter over the window (only counters read at both ends)."""
        out = {}
        for k, v in self.effects_after.items():
            old = self.effects_before.get(k)
            if v is not None and old is not None:
                out[k] = v - old
        return out

    def stream(self, stream: str, ctx: FaultContext | None = None) -> dict[str, Any]:
        """Bytes the proxy read on ``stream`` while the fault was in place and no blocking toxic
        before it was (see the module doc); before :meth:`close`, up to now.

        Returns:
            ``{"bytes", "bytes_in", "bytes_read", "connections_*", ...}`` (bytes: ints), with
            ``"held_by"`` when blocking toxics before it covered the window; ``{"bytes": None,
            "reason": ...}`` when unknown.
        """
        from chaos.proxy.sockets import connection_windows, destroyed_bytes, ended_read, stream_bytes

        after, counter_after = self.after, self.counter_after
        if not self.closed and ctx is not None and self.before is not None:
            counter_after = self._counters(ctx)
            after = self.sample(ctx)
        if self.before is None or after is None:
            return {"bytes": None, "reason": f"the link's sockets could not be read: {self.socket_error}"}
        if self.blocked_by and self.resumed is None:
            out: dict[str, Any] = {"bytes": 0, "bytes_in": 0, "bytes_read": 0, "held_by": self.blocked_by,
                                   "connections": []}
            out["reason"] = (f"{', '.join(self.blocked_by)} (before it in the {stream} chain) kept every byte "
                             "from it for its whole window")
            return out
        prior, before, counter_before = self.prior, self.before, self.counter_before
        if self.resumed is not None:  # the window starts when the last blocker was removed
            prior, (before, counter_before, _t) = self.before, self.resumed
            if before is None:
                return {"bytes": None, "reason": f"the link's sockets could not be read: {self.socket_error}"}
        out = stream_bytes(before, after, stream)
        closed_bytes = 0
        c0, c1 = counter_before.get(stream), counter_after.get(stream)
        if c0 is not None and c1 is not None:
            # Added when a connection ends: the ended connections' bytes (those opened in the
            # window too, which no socket sample saw) less what they had read before the window.
            read_before = ended_read(prior, before, after, stream)
            closed_bytes = max(0, (c1 - c0) - read_before)
            out["ended_connections_bytes"] = closed_bytes
        cut_bytes = 0
        if self.destroyed:
            # Read by connections the kernel destroyed in the window, after their last sample.
            cut_bytes = destroyed_bytes(prior, before, after, stream, self.destroyed)
            out["destroyed_connections_bytes"] = cut_bytes
        # The two measure the same ended connections: take the larger, never their sum. Only
        # bytes the proxy read count (a byte still in the socket never reached a toxic).
        out["bytes"] = out["bytes_read"] + max(closed_bytes, cut_bytes)
        out["connections"] = [asdict(c) for c in connection_windows(prior, before, after, stream, self.destroyed,
                                                                     self.destroyed_at, self.listen)]
        if self.resumed is not None:
            out["held_by"] = self.blocked_by
            out["resumed_after_s"] = round(self.resumed[2] - (self.t_open or self.resumed[2]), 3)
        if self.add_s is not None:
            out["add_s"] = self.add_s
        return out


def blocker_removed(ctx: FaultContext, link: str, stream: str, toxic: str) -> None:
    """Tell the open windows on ``link``/``stream`` that the blocking toxic ``toxic`` is gone
    (called by its heal once the proxy removed it)."""
    try:
        url = require_proxy(ctx).url
    except RuntimeError:
        return
    for window in list(_BLOCKED.get((url, link, stream), [])):
        window.unblock(ctx, toxic)


class ToxicFault(Fault):
    """Apply = add the toxic named after the fault id; heal = remove it; evidence = the
    bundled proxy's per-toxic counter, else the bytes on the toxic's stream while it was in
    place (module doc)."""

    toxic_type: ClassVar[str]
    params: ToxicParams

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """A request of the workload was in flight while the toxic was in place (its evidence:
        traffic crossed the link then), so it met the toxic, not only heartbeats did."""
        return DefaultTrigger("requests_in_place", "a request of the workload was in flight while the toxic "
                              "was on the link (and, as its evidence shows, traffic crossed it)")

    @classmethod
    def holds_lmcache_answers(cls, params: FaultParams) -> bool:
        """True on a link of LMCache's path (named after it: ``engine-lmcache``,
        ``lmcache-redis``): a toxic there keeps a lookup or load in flight longer."""
        return on_lmcache_path(params)

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
        self._window.watch_chain(ctx, self.params.stream, self.id)
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
            wait = self.removal_timeout_s()
            client.remove_toxic(self.params.link, self.id, **({"timeout_s": wait} if wait is not None else {}))
        except Exception as exc:
            if not _is_not_found(exc):
                raise
            return {"link": self.params.link, "toxic": self.id, "removed": False, "absent": True}
        if self.toxic_type in BLOCKING_TOXICS:
            blocker_removed(ctx, self.params.link, self.params.stream, self.id)
        return {"link": self.params.link, "toxic": self.id, "removed": True}

    def removal_timeout_s(self) -> float | None:
        """How long the proxy may take to answer the toxic's removal (None: the client's)."""
        return None

    def decide(self, stream: dict[str, Any]) -> tuple[bool, str | None]:
        """Whether the toxic bit, from what moved on its stream while it was in place (the
        real Toxiproxy, no per-toxic counter; :meth:`LinkWindow.stream`), and if not, why.
        This default: bytes reached it (latency, slicer, bandwidth act on every byte)."""
        if stream["bytes"] > 0:
            return True, None
        return False, stream.get("reason") or (
            f"no bytes arrived on the {self.params.stream} stream of {self.params.link} while the toxic was in place")

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
        else:
            bit, why = self.decide(stream)
            out["source"] = "stream bytes"
            if bit:
                out["bit"] = True
            else:
                out["reason"] = why
        return out
