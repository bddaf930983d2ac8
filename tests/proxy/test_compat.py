"""The bundled proxy against the real Toxiproxy 2.9.0, point by point (docs/toxiproxy-compat.md).

Each deviation measured between the two servers is either matched (both give the same answer
here) or kept on purpose, and then this file asserts each server's own behaviour, so a change
on either side shows up. Every test runs against both (the ``server`` fixture: bundled on
asyncio and uvloop, and the real server).
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from chaos.proxy.client import ToxiproxyClient, ToxiproxyError


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture
def echo_proxy(client, echo_upstream):
    return client.create_proxy("p", "127.0.0.1:0", echo_upstream.address)


def test_noop_is_a_toxic_type_of_both(client, echo_proxy, net):
    """Matched: the real server accepts its internal ``noop`` type; so does the bundled one."""
    t = client.add_toxic("p", "noop")
    assert (t.type, t.attributes) == ("noop", {})
    s = net.connect(echo_proxy.listen)
    s.sendall(b"abc")
    assert net.recv_exact(s, 3) == b"abc"
    s.close()


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1])
def test_integer_attributes_beyond_int64_are_refused_by_both(http, echo_proxy, value):
    """Matched: Go decodes attributes into int64, so 2**63 is a 400; the bundled proxy (Python
    ints have no bound) refuses it too. 2**63-1 is accepted by both."""
    r = http.post("/proxies/p/toxics", json={"type": "latency", "attributes": {"latency": value}})
    assert r.status_code == 400 and r.json()["error"].startswith("bad request body"), r.text
    r = http.post("/proxies/p/toxics", json={"type": "latency", "attributes": {"latency": 2**63 - 1}})
    assert r.status_code == 200 and r.json()["attributes"]["latency"] == 2**63 - 1


@pytest.mark.slow
def test_a_stalled_request_body_is_cut_off_after_15_s_by_both(server):
    """Matched: the real API server has ReadTimeout 15 s (api.go) and answers 503; the bundled
    one held such a request forever (and with it its own shutdown)."""
    host, port = server.url.rsplit("//", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=40) as s:
        s.sendall(b"POST /proxies HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{")
        t0 = time.monotonic()
        head = s.recv(4096)
        waited = time.monotonic() - t0
    assert head.startswith(b"HTTP/1.1 503"), head
    assert waited >= 14, waited  # not before the timeout: a lower bound, safe under load


def test_toxicity_outside_0_1(http, echo_proxy, real):
    """Kept: the real server accepts any toxicity (2 = always, -1 = never); the bundled one
    refuses it with 400, like every other out-of-range value. kvchaos never sends one (the
    scenario schema allows 0..1)."""
    for value in (2, -1):
        r = http.post("/proxies/p/toxics", json={"type": "latency", "name": f"t{value}", "toxicity": value})
        if real:
            assert r.status_code == 200 and r.json()["toxicity"] == value
        else:
            assert r.status_code == 400 and "toxicity" in r.json()["error"], r.text


def test_proxy_objects_and_the_logger_key(http, echo_proxy, client, real):
    """Kept: the real server leaks a Go field, ``"Logger": {}``, into every proxy object; the
    bundled one does not. ToxiproxyClient reads both."""
    body = http.get("/proxies/p").json()
    assert set(body) - {"Logger"} == {"name", "listen", "upstream", "enabled", "toxics"}
    assert ("Logger" in body) is real
    assert client.get_proxy("p").name == "p"
    assert set(client.proxies()) == {"p"}


def test_error_bodies_and_their_content_type(http, echo_proxy, client, real):
    """Kept: both answer errors with the JSON body ``{"error", "status"}``; the real server
    labels it ``text/plain``, the bundled one ``application/json``. The client reads both."""
    r = http.get("/proxies/nope")
    assert r.status_code == 404 and r.json() == {"error": "proxy not found", "status": 404}
    ctype = r.headers["content-type"]
    assert ctype.startswith("text/plain") if real else ctype.startswith("application/json"), ctype
    with pytest.raises(ToxiproxyError) as err:
        client.get_proxy("nope")
    assert (err.value.status, err.value.message) == (404, "proxy not found")


def test_populate_answers(client, echo_upstream, real):
    """Kept: for a proxy /populate keeps (same listen and upstream), the real server answers
    with the object as it was sent (no toxics, ``enabled`` false when not given), the bundled
    one with the proxy as it is. The state afterwards is the same on both; kvchaos never reads
    the answer (Stack.populate_links)."""
    first = client.populate([{"name": "a", "listen": "127.0.0.1:0", "upstream": echo_upstream.address,
                              "enabled": True}])
    listen = first[0].listen
    client.add_toxic("a", "latency", {"latency": 1})
    again = client.populate([{"name": "a", "listen": listen, "upstream": echo_upstream.address}])
    if real:
        assert again[0].toxics == [] and again[0].enabled is False
    else:
        assert len(again[0].toxics) == 1 and again[0].enabled is True
    kept = client.get_proxy("a")  # the state: kept as it was, on both
    assert kept.enabled is True and [t.type for t in kept.toxics] == ["latency"]


def test_half_close(client, net, real):
    """Kept: a client's half-close (FIN, still reading) reaches the server through the bundled
    proxy, and the answer sent after it comes back; the real server closes both directions at
    the client's FIN, so an answer sent after it is lost. No kvchaos link half-closes (ZMQ and
    RESP keep their connections open); matching the real server would lose answers."""
    def answer_after_eof(conn: socket.socket) -> None:
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
        conn.sendall(b"got:" + data)
        conn.shutdown(socket.SHUT_WR)

    up = net.Upstream(answer_after_eof)
    p = client.create_proxy("hc", "127.0.0.1:0", up.address)
    s = net.connect(p.listen)
    s.sendall(b"question")
    s.shutdown(socket.SHUT_WR)
    s.settimeout(10)
    try:
        got = net.recv_all(s)
    except ConnectionResetError:
        got = b""
    s.close()
    up.close()
    assert got == (b"" if real else b"got:question"), got


def test_listen_defaults_and_addresses(http, echo_upstream, real):
    """Kept: without ``listen`` the real server binds every interface (``[::]:port``) and takes
    any upstream string; the bundled one binds loopback and checks ``host:port``, and refuses
    non-loopback listen addresses unless started with --allow-remote (its API opens TCP links
    on request, so it stays on loopback by default)."""
    r = http.post("/proxies", json={"name": "x", "upstream": echo_upstream.address})
    assert r.status_code == 201
    listen = r.json()["listen"]
    assert listen.startswith("[::]:") if real else listen.startswith("127.0.0.1:"), listen
    r = http.post("/proxies", json={"name": "y", "upstream": "nohost"})
    assert r.status_code == (201 if real else 400), r.text


def test_the_client_speaks_to_both(server, echo_upstream):
    """What kvchaos itself calls, end to end, against either server."""
    with ToxiproxyClient(server.url) as c:
        assert c.version().startswith("2.9.0")
        c.populate([{"name": "l", "listen": "127.0.0.1:0", "upstream": echo_upstream.address}])
        c.add_toxic("l", "latency", {"latency": 5}, stream="upstream", toxicity=1.0, name="f-0")
        assert [t.name for t in c.toxics("l")] == ["f-0"]
        assert c.update_proxy("l", enabled=False).enabled is False
        assert c.update_proxy("l", enabled=True).enabled is True
        c.remove_toxic("l", "f-0")
        c.reset()
        assert c.metrics_text() is not None  # -proxy-metrics on the real one
        c.delete_proxy("l")
        assert c.proxies() == {}


def _received_total(client, proxy: str, direction: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(client.metrics_text() or "")
               for s in f.samples if s.name == "toxiproxy_proxy_received_bytes_total"
               and s.labels.get("proxy") == proxy and s.labels.get("direction") == direction)


def test_byte_counters_are_added_when_a_connection_ends_on_both(client, echo_proxy, net, real):
    """Matched: Toxiproxy adds a connection's bytes to toxiproxy_proxy_received_bytes_total
    when its copy ends (link.go); the bundled proxy added them live, so the byte evidence of
    chaos/faults/network.py counted a bundled connection's bytes twice."""
    if real:
        pytest.importorskip("prometheus_client")
    s = net.connect(echo_proxy.listen)
    s.sendall(b"0123456789")
    assert net.recv_exact(s, 10) == b"0123456789"
    assert _received_total(client, "p", "upstream") == 0  # still open
    s.close()
    deadline = time.monotonic() + 10
    while _received_total(client, "p", "upstream") < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _received_total(client, "p", "upstream") == 10
    assert _received_total(client, "p", "downstream") == 10


def test_a_reset_under_way_outlives_the_removal_on_both(client, echo_proxy, net):
    """Matched: Toxiproxy's reset_peer waits out its delay (reset_peer.go, no interrupt), so the
    DELETE answers after the reset and the connection is reset anyway; the bundled proxy
    cancelled the reset and answered at once."""
    client.add_toxic("p", "reset_peer", {"timeout": 1000}, stream="upstream", name="rst")
    s = net.connect(echo_proxy.listen)
    s.sendall(b"x")
    time.sleep(0.2)
    t0 = time.monotonic()
    client.remove_toxic("p", "rst", timeout_s=30)
    assert time.monotonic() - t0 >= 0.5
    s.settimeout(5)
    with pytest.raises((ConnectionResetError, OSError)):
        if s.recv(10) == b"":
            raise ConnectionResetError("closed")
    s.close()


def test_a_timeout_toxic_closes_after_its_timeout_without_data_on_both(client, echo_proxy, net):
    """Matched: Toxiproxy's timeout.go starts its timer again for each chunk it drops, so a
    connection that keeps sending stays open; the bundled proxy closed it ``timeout`` after
    the toxic's start whatever came."""
    client.add_toxic("p", "timeout", {"timeout": 600}, stream="upstream", name="hole")
    s = net.connect(echo_proxy.listen)
    s.settimeout(0.1)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.5:  # a byte every 0.1 s: never 600 ms without data
        s.sendall(b"x")
        try:
            assert s.recv(10) != b"", "closed while data kept coming"
        except socket.timeout:
            pass
    s.settimeout(5)
    t1 = time.monotonic()
    assert s.recv(10) == b""  # silence: closed after the timeout
    assert time.monotonic() - t1 >= 0.4
    s.close()
