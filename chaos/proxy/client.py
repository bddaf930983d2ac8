"""``ToxiproxyClient``: the one client kvchaos uses to drive a Toxiproxy (real or ours).

Calls Toxiproxy 2.x's documented REST API (README "HTTP API" of Shopify/toxiproxy) over
httpx, with a timeout on every call. Updates use ``PATCH`` (Toxiproxy >= 2.6.0, which
deprecates ``POST`` for updates) and fall back to ``POST`` on 405 or 404 for older 2.x servers. Every non-2xx answer raises :class:`ToxiproxyError` carrying the HTTP
status and the server's ``error`` message.

Example::

    with ToxiproxyClient("http://127.0.0.1:8474") as tp:
        p = tp.create_proxy("redis", "127.0.0.1:0", "127.0.0.1:6379")
        tp.add_toxic("redis", "latency", {"latency": 200}, stream="downstream")
        ...
        tp.remove_toxic("redis", "latency_downstream")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from chaos.proxy.models import ProxyInfo, ToxicInfo

# Public names of the API shapes for callers.
Proxy = ProxyInfo
Toxic = ToxicInfo

DEFAULT_URL = "http://127.0.0.1:8474"
TOXIC_METRIC = "toxiproxy_toxic_connections"  # counter family (text name adds _total)


class ToxiproxyError(Exception):
    """The API answered with an error (or could not be reached: status 0).

    Attributes:
        status: HTTP status (400 bad input, 404 not found, 409 exists, 500 e.g. listen
            failed); 0 when no HTTP answer came (connection refused, timeout).
        message: the server's ``error`` text, or the transport error.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"toxiproxy: HTTP {status}: {message}" if status else
                         f"toxiproxy: {message}")
        self.status = status
        self.message = message


class ToxiproxyClient:
    """Synchronous client of a Toxiproxy 2.x API.

    Args:
        url: base URL of the API, e.g. ``http://127.0.0.1:8474``.
        timeout_s: seconds allowed for each call (connect, read and write each).
    """

    def __init__(self, url: str = DEFAULT_URL, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s),
                                  headers={"User-Agent": "kvchaos-toxiproxy-client"},
                                  trust_env=False)

    # --- plumbing -----------------------------------------------------------------------
    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __enter__(self) -> ToxiproxyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, json: Any = None,
              ok: tuple[int, ...] = (200, 201, 204), timeout_s: float | None = None) -> httpx.Response:
        try:
            if timeout_s is None:
                response = self._http.request(method, path, json=json)
            else:
                response = self._http.request(method, path, json=json, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise ToxiproxyError(0, f"{method} {self.url}{path}: {exc!r}") from exc
        if response.status_code not in ok:
            raise ToxiproxyError(response.status_code, _message(response))
        return response

    def _update(self, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            return self._call("PATCH", path, json=body)
        except ToxiproxyError as exc:
            # Toxiproxy < 2.6.0 has no PATCH route: its router answers 405 (gorilla/mux >= 1.6.1)
            # or 404 (older routers). A real 404 (no such proxy/toxic) comes back from the POST.
            if exc.status not in (404, 405):
                raise
            return self._call("POST", path, json=body)

    # --- server -------------------------------------------------------------------------
    def version(self) -> str:
        """Return the server version (``GET /version``), e.g. ``"2.9.0"``.

        Older Toxiproxy versions answer plain text; both forms are accepted.
        """
        response = self._call("GET", "/version")
        try:
            return str(response.json()["version"])
        except (ValueError, KeyError, TypeError):
            return response.text.strip()

    def reset(self) -> None:
        """Enable every proxy and remove every toxic (``POST /reset``)."""
        self._call("POST", "/reset")

    # --- proxies ------------------------------------------------------------------------
    def proxies(self) -> dict[str, Proxy]:
        """Return all proxies by name (``GET /proxies``)."""
        data = self._call("GET", "/proxies").json()
        return {name: Proxy.model_validate(p) for name, p in data.items()}

    def create_proxy(self, name: str, listen: str, upstream: str, enabled: bool = True) -> Proxy:
        """Create a proxy (``POST /proxies``); ``listen`` port 0 picks a free port.

        Returns:
            The proxy, ``listen`` being the address actually bound.
        Raises:
            ToxiproxyError: 400 bad input, 409 name taken, 500 listen failed.
        """
        body = {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled}
        return Proxy.model_validate(self._call("POST", "/proxies", json=body).json())

    def get_proxy(self, name: str) -> Proxy:
        """Return proxy ``name`` (``GET /proxies/{name}``). Raises ToxiproxyError 404."""
        return Proxy.model_validate(self._call("GET", f"/proxies/{name}").json())

    def update_proxy(self, name: str, *, enabled: bool | None = None, listen: str | None = None,
                     upstream: str | None = None) -> Proxy:
        """Change a proxy (``PATCH /proxies/{name}``); only the given fields are sent.

        ``enabled=False`` closes its connections and refuses new ones until re-enabled.
        Raises ToxiproxyError 404 (no proxy), 400 (bad value), 500 (listen failed).
        """
        body = {k: v for k, v in (("enabled", enabled), ("listen", listen),
                                  ("upstream", upstream)) if v is not None}
        return Proxy.model_validate(self._update(f"/proxies/{name}", body).json())

    def delete_proxy(self, name: str) -> None:
        """Delete a proxy (``DELETE /proxies/{name}``). Raises ToxiproxyError 404."""
        self._call("DELETE", f"/proxies/{name}")

    def populate(self, proxies: Iterable[Mapping[str, Any]]) -> list[Proxy]:
        """Create or replace proxies in bulk (``POST /populate``).

        Args:
            proxies: items ``{"name", "listen", "upstream"[, "enabled"]}``.
        Raises:
            ToxiproxyError: the status and message of the first failure.
        """
        data = self._call("POST", "/populate", json=[dict(p) for p in proxies]).json()
        return [Proxy.model_validate(p) for p in data.get("proxies") or []]

    # --- toxics -------------------------------------------------------------------------
    def toxics(self, proxy: str) -> list[Toxic]:
        """Return the toxics of ``proxy`` (``GET /proxies/{proxy}/toxics``)."""
        return [Toxic.model_validate(t)
                for t in self._call("GET", f"/proxies/{proxy}/toxics").json()]

    def get_toxic(self, proxy: str, name: str) -> Toxic:
        """Return one toxic (``GET /proxies/{proxy}/toxics/{name}``). Raises 404."""
        return Toxic.model_validate(self._call("GET", f"/proxies/{proxy}/toxics/{name}").json())

    def add_toxic(self, proxy: str, type: str, attributes: Mapping[str, Any] | None = None,
                  stream: str = "downstream", toxicity: float = 1.0,
                  name: str | None = None) -> Toxic:
        """Add a toxic (``POST /proxies/{proxy}/toxics``); it acts on open connections too.

        Args:
            type: latency, bandwidth, slow_close, timeout, reset_peer, slicer, limit_data.
            attributes: the type's settings (units per Toxiproxy's README, e.g. ms, KB/s).
            stream: "upstream" (client -> server) or "downstream" (server -> client).
            toxicity: probability in [0, 1] that the toxic acts on a given connection.
            name: defaults to ``<type>_<stream>``.
        Raises:
            ToxiproxyError: 400 bad type/stream/attributes, 404 no proxy, 409 name taken.
        """
        body: dict[str, Any] = {"type": type, "stream": stream, "toxicity": toxicity,
                                "attributes": dict(attributes or {})}
        if name is not None:
            body["name"] = name
        return Toxic.model_validate(self._call("POST", f"/proxies/{proxy}/toxics",
                                               json=body).json())

    def update_toxic(self, proxy: str, name: str, attributes: Mapping[str, Any] | None = None,
                     toxicity: float | None = None) -> Toxic:
        """Change a toxic's attributes and/or toxicity (``PATCH``); others are kept.

        Raises ToxiproxyError 404 (no proxy or toxic), 400 (bad attributes).
        """
        body: dict[str, Any] = {"attributes": dict(attributes or {})}
        if toxicity is not None:
            body["toxicity"] = toxicity
        return Toxic.model_validate(self._update(f"/proxies/{proxy}/toxics/{name}",
                                                 body).json())

    def remove_toxic(self, proxy: str, name: str, timeout_s: float | None = None) -> None:
        """Remove a toxic (``DELETE /proxies/{proxy}/toxics/{name}``). Raises 404.

        Args:
            timeout_s: how long to wait for the answer (default: the client's timeout). Both
                servers answer the removal of a ``reset_peer`` only once the resets whose delay
                already started are done (Toxiproxy 2.9.0 ``reset_peer.go`` waits them out), so
                give it at least the toxic's ``timeout`` (ms) / 1000 plus a margin.
        """
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}", timeout_s=timeout_s)

    # --- evidence -----------------------------------------------------------------------
    def metrics_text(self) -> str | None:
        """Return ``GET /metrics`` (Prometheus text), or None if the server has none (404,
        e.g. a real Toxiproxy started without metrics flags)."""
        response = self._call("GET", "/metrics", ok=(200, 404))
        return response.text if response.status_code == 200 else None

    def toxic_connection_counts(self) -> dict[tuple[str, str], int] | None:
        """Return ``{(proxy, toxic): connections the toxic acted on}`` from /metrics.

        None if the server has no /metrics; empty if it exports no per-toxic counter (a
        real Toxiproxy). Parsed with prometheus_client's text parser; metric
        ``toxiproxy_toxic_connections_total`` (see :mod:`chaos.proxy.metrics`).
        """
        text = self.metrics_text()
        if text is None:
            return None
        return parse_toxic_connections(text)


def parse_toxic_connections(text: str) -> dict[tuple[str, str], int]:
    """Parse Prometheus ``text`` into ``{(proxy, toxic): count}``; empty if absent."""
    counts: dict[tuple[str, str], int] = {}
    for family in text_string_to_metric_families(text):
        if family.name != TOXIC_METRIC:
            continue
        for sample in family.samples:
            if sample.name == TOXIC_METRIC + "_total":
                key = (sample.labels["proxy"], sample.labels["toxic"])
                counts[key] = counts.get(key, 0) + int(sample.value)
    return counts


def _message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(data, dict) and "error" in data:
        return str(data["error"])
    return response.text.strip()
