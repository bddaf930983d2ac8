"""Counters that show a fault really bit, exported at ``GET /metrics`` (Prometheus text).

Metric names (all labels are strings):

``toxiproxy_proxy_connections_total{proxy}``
    client connections accepted by the proxy.
``toxiproxy_proxy_connections_open{proxy}``
    connections open now (gauge).
``toxiproxy_proxy_bytes_total{proxy, direction}``
    bytes read from the source of each direction: ``upstream`` = client -> server,
    ``downstream`` = server -> client.
``toxiproxy_toxic_connections_total{proxy, toxic, type, stream}``
    connections a toxic acted on: counted once per connection and direction, the first time
    a toxic whose toxicity roll fired on that connection touched its data, its close, or its
    timer. A toxic that never met traffic (or lost every roll) stays at 0.
``toxiproxy_proxy_received_bytes_total`` / ``toxiproxy_proxy_sent_bytes_total``
    ``{direction, listener, proxy, upstream}``: the names, labels and timing real Toxiproxy
    2.9.0 has with ``-proxy-metrics`` (its METRICS.md; ``link.go`` adds a connection's bytes
    once its copy ends): a connection's bytes are added when that direction of it closes,
    never while it is open, so byte evidence (chaos/faults/network.py) reads the same from
    both servers. The live count is ``toxiproxy_proxy_bytes_total``.

Counts are kept per proxy name and survive the proxy being deleted (a healed fault that
deletes its proxy keeps its evidence); a server restart starts them from zero.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from chaos.proxy.toxic_collection import ToxicWrapper

DIRECTIONS = ("upstream", "downstream")


class ProxyStats:
    """Plain-int counters of one proxy, bumped on the data path (no locks: one event loop)."""

    __slots__ = ("name", "listen", "upstream", "connections_total", "open_connections",
                 "received", "sent", "received_closed", "sent_closed", "toxic_connections")

    def __init__(self, name: str) -> None:
        self.name = name
        self.listen = ""
        self.upstream = ""
        self.connections_total = 0
        self.open_connections = 0
        self.received = {d: 0 for d in DIRECTIONS}
        self.sent = {d: 0 for d in DIRECTIONS}
        # Bytes of connections whose link of that direction has closed (Toxiproxy's timing).
        self.received_closed = {d: 0 for d in DIRECTIONS}
        self.sent_closed = {d: 0 for d in DIRECTIONS}
        # (toxic name, type, stream) -> connections acted on
        self.toxic_connections: dict[tuple[str, str, str], int] = {}

    def link_closed(self, direction: str, received: int, sent: int) -> None:
        """Add one closed link's bytes to the at-close counters (Toxiproxy's)."""
        self.received_closed[direction] += received
        self.sent_closed[direction] += sent

    def toxic_added(self, wrapper: ToxicWrapper) -> None:
        """Export a 0 for a new toxic, so "never acted" reads as 0, not as absent."""
        self.toxic_connections.setdefault((wrapper.name, wrapper.type, wrapper.stream), 0)

    def toxic_acted(self, wrapper: ToxicWrapper) -> None:
        """Count one more connection that toxic ``wrapper`` acted on."""
        key = (wrapper.name, wrapper.type, wrapper.stream)
        self.toxic_connections[key] = self.toxic_connections.get(key, 0) + 1


class StatsCollector:
    """prometheus_client collector reading :class:`ProxyStats` at scrape time."""

    def __init__(self, stats: dict[str, ProxyStats]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        conns = CounterMetricFamily("toxiproxy_proxy_connections",
                                    "Client connections accepted by the proxy", labels=["proxy"])
        open_ = GaugeMetricFamily("toxiproxy_proxy_connections_open",
                                  "Connections open through the proxy now", labels=["proxy"])
        nbytes = CounterMetricFamily("toxiproxy_proxy_bytes",
                                     "Bytes read from the source of each direction",
                                     labels=["proxy", "direction"])
        toxic = CounterMetricFamily("toxiproxy_toxic_connections",
                                    "Connections a toxic acted on",
                                    labels=["proxy", "toxic", "type", "stream"])
        upstream_labels = ["direction", "listener", "proxy", "upstream"]
        received = CounterMetricFamily("toxiproxy_proxy_received_bytes",
                                       "Bytes received by the proxy (Toxiproxy's name)",
                                       labels=upstream_labels)
        sent = CounterMetricFamily("toxiproxy_proxy_sent_bytes",
                                   "Bytes sent by the proxy (Toxiproxy's name)",
                                   labels=upstream_labels)
        for s in list(self.stats.values()):
            conns.add_metric([s.name], s.connections_total)
            open_.add_metric([s.name], s.open_connections)
            for d in DIRECTIONS:
                nbytes.add_metric([s.name, d], s.received[d])
                received.add_metric([d, s.listen, s.name, s.upstream], s.received_closed[d])
                sent.add_metric([d, s.listen, s.name, s.upstream], s.sent_closed[d])
            for (name, type_, stream), count in sorted(s.toxic_connections.items()):
                toxic.add_metric([s.name, name, type_, stream], count)
        yield from (conns, open_, nbytes, toxic, received, sent)


def render(stats: dict[str, ProxyStats]) -> bytes:
    """Return the Prometheus text exposition (format 0.0.4) of ``stats``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(stats))  # type: ignore[arg-type]
    return generate_latest(registry)
