"""ToxiproxyClient against a server with Toxiproxy 2.5's routes: updates are POST only (2.6.0
added PATCH and deprecated POST for updates, see Toxiproxy's CHANGELOG). A router answers a
method a route lacks with 405 (gorilla/mux >= 1.6.1) or 404 (older ones): the client must fall
back to POST on either, and raise what the POST answers."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest

from chaos.proxy.client import ToxiproxyClient, ToxiproxyError
from kvchaos_support import http_server


class Toxiproxy25(BaseHTTPRequestHandler):
    """One proxy "redis" with one toxic "lag"; PATCH has no route (405)."""

    protocol_version = "HTTP/1.1"
    calls: list[tuple[str, str, dict | None]] = []
    patch_status = 405
    toxic = {"name": "lag", "type": "latency", "stream": "downstream", "toxicity": 1.0,
             "attributes": {"latency": 100, "jitter": 0}}
    proxy = {"name": "redis", "listen": "127.0.0.1:16379", "upstream": "127.0.0.1:6379",
             "enabled": True, "toxics": []}

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: object) -> None:
        data = (json.dumps(body) if not isinstance(body, str) else body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict | None:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n)) if n else None

    def do_PATCH(self) -> None:  # noqa: N802
        type(self).calls.append(("PATCH", self.path, self._body()))
        self._send(type(self).patch_status, "Method Not Allowed\n" if type(self).patch_status == 405
                   else "404 page not found\n")

    def do_POST(self) -> None:  # noqa: N802
        body = self._body()
        cls = type(self)
        cls.calls.append(("POST", self.path, body))
        if self.path == "/proxies/redis/toxics/lag":
            cls.toxic = {**cls.toxic, "attributes": {**cls.toxic["attributes"], **body["attributes"]}}
            return self._send(200, cls.toxic)
        if self.path == "/proxies/redis":
            cls.proxy = {**cls.proxy, **body}
            return self._send(200, cls.proxy)
        self._send(404, {"error": "toxic not found", "status": 404})


@pytest.fixture(params=[405, 404])
def old_server(request):
    Toxiproxy25.calls = []
    Toxiproxy25.patch_status = request.param
    with http_server(Toxiproxy25) as port:
        with ToxiproxyClient(f"http://127.0.0.1:{port}", timeout_s=5) as client:
            yield client


def test_update_toxic_falls_back_to_post_on_405(old_server):
    toxic = old_server.update_toxic("redis", "lag", {"latency": 250})
    assert toxic.attributes["latency"] == 250 and toxic.attributes["jitter"] == 0
    assert [(m, p) for m, p, _ in Toxiproxy25.calls] == [
        ("PATCH", "/proxies/redis/toxics/lag"), ("POST", "/proxies/redis/toxics/lag")]
    assert Toxiproxy25.calls[0][2] == Toxiproxy25.calls[1][2] == {"attributes": {"latency": 250}}


def test_update_proxy_falls_back_to_post_on_405(old_server):
    proxy = old_server.update_proxy("redis", enabled=False)
    assert proxy.enabled is False
    assert [m for m, _, _ in Toxiproxy25.calls] == ["PATCH", "POST"]


def test_an_error_of_the_post_is_raised_not_retried(old_server):
    with pytest.raises(ToxiproxyError) as err:
        old_server.update_toxic("redis", "no-such-toxic", {"latency": 1})
    assert err.value.status == 404
    assert [m for m, _, _ in Toxiproxy25.calls] == ["PATCH", "POST"]
