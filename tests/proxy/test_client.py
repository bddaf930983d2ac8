"""Acceptance 4: ToxiproxyClient against our server, route by route, as Toxiproxy documents.

The same calls are what kvchaos makes against a real Toxiproxy 2.x; each test states the
documented status and shape it relies on.
"""

from __future__ import annotations

import httpx
import pytest

from chaos.proxy.client import ToxiproxyClient, ToxiproxyError, parse_toxic_connections


def test_version(client):
    assert client.version().startswith("2.")


def test_create_get_list_update_delete(client, echo_upstream, net):
    p = client.create_proxy("echo", "127.0.0.1:0", echo_upstream.address)
    assert p.enabled and p.toxics == [] and not p.listen.endswith(":0")
    assert client.get_proxy("echo") == p
    assert list(client.proxies()) == ["echo"]
    s = net.connect(p.listen)
    s.sendall(b"abc")
    assert net.recv_exact(s, 3) == b"abc"
    off = client.update_proxy("echo", enabled=False)
    assert off.enabled is False and off.listen == p.listen
    assert s.recv(1) == b""
    with pytest.raises(ConnectionRefusedError):
        net.connect(p.listen)
    on = client.update_proxy("echo", enabled=True)
    assert on.enabled and on.listen == p.listen
    moved = client.update_proxy("echo", listen="127.0.0.1:0")
    assert moved.listen != p.listen and moved.enabled
    s = net.connect(moved.listen)
    s.sendall(b"x")
    assert net.recv_exact(s, 1) == b"x"
    s.close()
    client.delete_proxy("echo")
    assert client.proxies() == {}
    with pytest.raises(ToxiproxyError) as err:
        client.get_proxy("echo")
    assert err.value.status == 404 and err.value.message == "proxy not found"


def test_create_disabled_does_not_listen(client, echo_upstream):
    p = client.create_proxy("off", "127.0.0.1:0", echo_upstream.address, enabled=False)
    assert p.enabled is False and p.listen == "127.0.0.1:0"


def test_toxic_routes(client, echo_upstream):
    client.create_proxy("echo", "127.0.0.1:0", echo_upstream.address)
    t = client.add_toxic("echo", "latency", {"latency": 100}, stream="upstream", toxicity=0.7)
    assert (t.name, t.type, t.stream, t.toxicity) == ("latency_upstream", "latency",
                                                      "upstream", pytest.approx(0.7))
    assert t.attributes == {"latency": 100, "jitter": 0}
    named = client.add_toxic("echo", "limit_data", {"bytes": 5}, name="cut")
    assert named.name == "cut" and named.stream == "downstream"
    assert [x.name for x in client.toxics("echo")] == ["latency_upstream", "cut"]
    assert client.get_toxic("echo", "cut") == named
    u = client.update_toxic("echo", "latency_upstream", {"jitter": 5})
    assert u.attributes == {"latency": 100, "jitter": 5} and u.toxicity == pytest.approx(0.7)
    u = client.update_toxic("echo", "latency_upstream", toxicity=0.2)
    assert u.toxicity == pytest.approx(0.2) and u.attributes["jitter"] == 5
    assert client.get_proxy("echo").toxics == client.toxics("echo")
    client.remove_toxic("echo", "cut")
    assert [x.name for x in client.toxics("echo")] == ["latency_upstream"]
    client.reset()
    assert client.toxics("echo") == []


def test_populate_creates_keeps_and_replaces(client, echo_upstream):
    first = client.populate([{"name": "a", "listen": "127.0.0.1:0",
                              "upstream": echo_upstream.address}])
    listen = first[0].listen
    client.add_toxic("a", "latency", {"latency": 1})
    # Same listen and upstream: kept as is, toxics included.
    again = client.populate([{"name": "a", "listen": listen, "upstream": echo_upstream.address},
                             {"name": "b", "listen": "127.0.0.1:0",
                              "upstream": echo_upstream.address, "enabled": False}])
    assert [p.name for p in again] == ["a", "b"]
    kept = client.get_proxy("a")  # (the answer's shape differs: tests/proxy/test_compat.py)
    assert kept.listen == listen and len(kept.toxics) == 1
    assert client.get_proxy("b").enabled is False
    # Different upstream: replaced (toxics gone).
    replaced = client.populate([{"name": "a", "listen": listen, "upstream": "127.0.0.1:1"}])
    assert replaced[0].upstream == "127.0.0.1:1" and replaced[0].toxics == []


def test_errors_raise_with_status_and_message(client, echo_upstream):
    client.create_proxy("echo", "127.0.0.1:0", echo_upstream.address)
    cases = [
        (lambda: client.create_proxy("echo", "127.0.0.1:0", echo_upstream.address), 409,
         "proxy already exists"),
        (lambda: client.add_toxic("echo", "nope"), 400, "invalid toxic type"),
        (lambda: client.add_toxic("nope", "latency"), 404, "proxy not found"),
        (lambda: client.remove_toxic("echo", "nope"), 404, "toxic not found"),
        (lambda: client.update_toxic("echo", "nope", {"latency": 1}), 404, "toxic not found"),
        (lambda: client.delete_proxy("nope"), 404, "proxy not found"),
    ]
    for call, status, message in cases:
        with pytest.raises(ToxiproxyError) as err:
            call()
        assert err.value.status == status
        assert err.value.message.startswith(message)


def test_unreachable_server_raises_status_zero_quickly():
    import time
    with ToxiproxyClient("http://127.0.0.1:1", timeout_s=0.5) as c:
        t0 = time.perf_counter()
        with pytest.raises(ToxiproxyError) as err:
            c.version()
        assert err.value.status == 0
        assert time.perf_counter() - t0 < 2


def test_metrics_evidence(client, echo_upstream, net, real):
    p = client.create_proxy("echo", "127.0.0.1:0", echo_upstream.address)
    if real:
        _real_metrics(client, p, net)
        return
    client.add_toxic("echo", "latency", {"latency": 1}, name="lag")
    client.add_toxic("echo", "latency", {"latency": 1}, name="never", toxicity=0.0)
    for _ in range(3):
        s = net.connect(p.listen)
        s.sendall(b"0123456789")
        assert net.recv_exact(s, 10) == b"0123456789"
        s.close()
    counts = client.toxic_connection_counts()
    assert counts[("echo", "lag")] == 3
    assert counts[("echo", "never")] == 0
    text = client.metrics_text()
    assert 'toxiproxy_proxy_connections_total{proxy="echo"} 3.0' in text
    assert 'toxiproxy_proxy_bytes_total{direction="upstream",proxy="echo"} 30.0' in text
    assert 'toxiproxy_proxy_bytes_total{direction="downstream",proxy="echo"} 30.0' in text
    # Evidence survives the proxy's deletion.
    client.delete_proxy("echo")
    assert client.toxic_connection_counts()[("echo", "lag")] == 3


def test_metrics_helpers_on_a_server_without_them(server):
    # A real Toxiproxy exports no per-toxic counter: empty, not an error.
    assert parse_toxic_connections("# TYPE go_goroutines gauge\ngo_goroutines 12\n") == {}

    class NoMetrics(ToxiproxyClient):
        def __init__(self) -> None:
            super().__init__(server.url)
            self._http = httpx.Client(base_url=server.url + "/nothing-here", timeout=2)

    with NoMetrics() as c:
        assert c.metrics_text() is None
        assert c.toxic_connection_counts() is None


def _real_metrics(client, p, net) -> None:
    """The real server (-proxy-metrics): no per-toxic counter; bytes per proxy and direction,
    added when a connection ends (what chaos/faults/network.py builds its evidence on)."""
    client.add_toxic("echo", "latency", {"latency": 1}, name="lag")
    s = net.connect(p.listen)
    s.sendall(b"0123456789")
    assert net.recv_exact(s, 10) == b"0123456789"
    assert "toxiproxy_proxy_received_bytes_total" not in client.metrics_text()  # still open
    s.close()
    import time

    deadline = time.monotonic() + 10
    while "toxiproxy_proxy_received_bytes_total" not in client.metrics_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    text = client.metrics_text()
    assert client.toxic_connection_counts() == {}
    assert 'direction="upstream"' in text and 'proxy="echo"' in text
