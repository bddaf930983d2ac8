"""Acceptance 5: bad input gets Toxiproxy's status code and a clear message; the server lives.

Raw HTTP (httpx) so the exact status, JSON body and wording are checked.
"""

from __future__ import annotations

import socket

import httpx
import pytest


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=5) as c:
        yield c


@pytest.fixture
def proxy(http, echo_upstream):
    r = http.post("/proxies", json={"name": "p", "listen": "127.0.0.1:0",
                                    "upstream": echo_upstream.address})
    assert r.status_code == 201
    return r.json()


@pytest.fixture
def err(real):
    """``err(response, status, starts)``: the status and the JSON error body; the wording is
    checked up to its first colon on the real server (its details are Go's json errors)."""
    def check(r: httpx.Response, status: int, starts: str) -> None:
        assert r.status_code == status, r.text
        body = r.json()
        assert body["status"] == status
        want = starts.split(":")[0] if real else starts
        assert body["error"].startswith(want), body["error"]
    return check


#: Input the real server accepts and the bundled proxy refuses (kept, docs/toxiproxy-compat.md).
def refused_by_bundled(real, r: httpx.Response, err, status: int, starts: str) -> None:
    if real:
        assert r.status_code in (200, 201), r.text
    else:
        err(r, status, starts)


def test_proxy_errors(http, proxy, echo_upstream, err, real):
    up = echo_upstream.address
    err(http.post("/proxies", json={"name": "p", "upstream": up}), 409, "proxy already exists")
    err(http.post("/proxies", json={"upstream": up}), 400, "missing required field: name")
    err(http.post("/proxies", json={"name": "q"}), 400, "missing required field: upstream")
    err(http.post("/proxies", content=b"{not json"), 400, "bad request body")
    err(http.post("/proxies", json={"name": 5, "upstream": up}), 400, "bad request body: name")
    err(http.post("/proxies", json={"name": "q", "upstream": up, "enabled": "yes"}), 400,
        "bad request body: enabled")
    refused_by_bundled(real, http.post("/proxies", json={"name": "q", "upstream": "nohost"}), err, 400,
                       "bad request body")
    if not real:  # the real server binds any address it is given
        err(http.post("/proxies", json={"name": "q", "listen": "10.1.2.3:0", "upstream": up}), 400,
            "listen address is not loopback")
    err(http.get("/proxies/zz"), 404, "proxy not found")
    err(http.patch("/proxies/zz", json={"enabled": False}), 404, "proxy not found")
    err(http.delete("/proxies/zz"), 404, "proxy not found")
    err(http.patch("/proxies/p", json={"enabled": 0}), 400, "bad request body: enabled")


def test_listen_address_in_use(http, proxy, echo_upstream, err):
    taken = socket.create_server(("127.0.0.1", 0))
    addr = "127.0.0.1:%d" % taken.getsockname()[1]
    # Toxiproxy reports a failed listen as an untyped error: HTTP 500 with Go's wording.
    err(http.post("/proxies", json={"name": "q", "listen": addr,
                                    "upstream": echo_upstream.address}), 500,
        f"listen tcp {addr}: bind: address already in use")
    assert "q" not in http.get("/proxies").json()
    err(http.patch("/proxies/p", json={"listen": addr}), 500, f"listen tcp {addr}")
    taken.close()
    assert http.get("/version").status_code == 200  # still serving


def test_toxic_errors(http, proxy, err, real):
    t = "/proxies/p/toxics"
    err(http.post(t, json={"type": "nope"}), 400, "invalid toxic type")
    err(http.post(t, json={"type": "latency", "stream": "sideways"}), 400, "stream was invalid")
    err(http.post(t, json={"type": "latency", "attributes": {"latency": "100"}}), 400,
        "bad request body: attributes of latency: latency")
    err(http.post(t, json={"type": "latency", "attributes": {"latency": 1.5}}), 400,
        "bad request body")
    err(http.post(t, json={"type": "latency", "toxicity": "high"}), 400, "bad request body")
    refused_by_bundled(real, http.post(t, json={"type": "latency", "name": "t2", "toxicity": 2}), err, 400,
                       "bad request body")
    refused_by_bundled(real, http.post(t, json={"type": "slicer", "attributes": {"average_size": 0}}), err,
                       400, "bad request body")
    err(http.post("/proxies/zz/toxics", json={"type": "latency"}), 404, "proxy not found")
    r = http.post(t, json={"type": "latency", "attributes": {"latency": 5, "unknown": 1}})
    assert r.status_code == 200 and r.json()["attributes"] == {"latency": 5, "jitter": 0}
    err(http.post(t, json={"type": "latency"}), 409, "toxic already exists")
    err(http.get(t + "/nope"), 404, "toxic not found")
    err(http.patch(t + "/nope", json={}), 404, "toxic not found")
    err(http.delete(t + "/nope"), 404, "toxic not found")
    err(http.patch(t + "/latency_downstream", json={"attributes": {"jitter": "x"}}), 400,
        "bad request body")
    # A failed update changes nothing.
    assert http.get(t + "/latency_downstream").json()["attributes"]["jitter"] == 0


def test_success_shapes_and_codes(http, proxy, err):
    assert set(proxy) - {"Logger"} == {"name", "listen", "upstream", "enabled", "toxics"}
    r = http.post("/proxies/p/toxics", json={"type": "timeout", "attributes": {"timeout": 5}})
    assert r.status_code == 200
    assert r.json() == {"attributes": {"timeout": 5}, "name": "timeout_downstream",
                        "type": "timeout", "stream": "downstream", "toxicity": 1.0}
    assert http.post("/proxies/p", json={"enabled": False}).json()["enabled"] is False
    assert http.post("/reset").status_code == 204
    assert http.get("/proxies/p").json()["enabled"] is True
    assert http.delete("/proxies/p").status_code == 204
    r = http.post("/populate", json=[{"name": "a", "upstream": "127.0.0.1:1"}])
    assert r.status_code == 201 and [p["name"] for p in r.json()["proxies"]] == ["a"]
    err(http.post("/populate", json=[{"name": "b"}]), 400,
        "missing required field: upstream at proxy 1")
    v = http.get("/version")
    assert v.headers["content-type"].startswith("application/json")
    assert v.json()["version"].startswith("2.")
    m = http.get("/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")


def test_browsers_are_refused(http):
    assert http.get("/proxies", headers={"User-Agent": "Mozilla/5.0"}).status_code == 403


def test_populate_error_reports_partial_result(http, echo_upstream, real):
    taken = socket.create_server(("127.0.0.1", 0))
    addr = "127.0.0.1:%d" % taken.getsockname()[1]
    r = http.post("/populate", json=[
        {"name": "ok", "listen": "127.0.0.1:0", "upstream": echo_upstream.address},
        {"name": "bad", "listen": addr, "upstream": echo_upstream.address}])
    taken.close()
    assert r.status_code == 500
    body = r.json()
    assert body["status"] == 500 and "address already in use" in body["error"]
    assert [p["name"] for p in body["proxies"]] == ["ok"]
