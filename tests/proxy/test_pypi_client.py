"""Acceptance 1: the unmodified PyPI client ``toxiproxy-python`` drives our server."""

from __future__ import annotations

import pytest
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists


TOXICS = {
    "latency": {"latency": 10, "jitter": 1},
    "bandwidth": {"rate": 1000},
    "slow_close": {"delay": 10},
    "timeout": {"timeout": 1000},
    "reset_peer": {"timeout": 1000},
    "slicer": {"average_size": 64, "size_variation": 8, "delay": 10},
    "limit_data": {"bytes": 1000},
}


@pytest.fixture
def tp(server):
    t = Toxiproxy()
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    t.update_api_consumer(host, int(port))
    return t


def test_create_list_destroy(tp, echo_upstream, net):
    assert tp.running()
    assert b"version" in tp.version()
    proxy = tp.create(upstream=echo_upstream.address, name="echo", listen="127.0.0.1:0")
    assert proxy.listen.startswith("127.0.0.1:") and not proxy.listen.endswith(":0")
    assert proxy.enabled is True
    assert set(tp.proxies()) == {"echo"}
    assert tp.get_proxy("echo").upstream == echo_upstream.address
    s = net.connect(proxy.listen)
    s.sendall(b"ping")
    assert net.recv_exact(s, 4) == b"ping"
    s.close()
    with pytest.raises(ProxyExists):
        tp.create(upstream=echo_upstream.address, name="echo")
    assert tp.destroy(proxy)
    assert tp.proxies() == {}
    with pytest.raises(NotFound):
        proxy.destroy()


def test_add_each_toxic_then_reset(tp, echo_upstream):
    proxy = tp.create(upstream=echo_upstream.address, name="echo")
    for stream in ("upstream", "downstream"):
        for type_, attributes in TOXICS.items():
            proxy.add_toxic(type=type_, stream=stream, attributes=attributes, toxicity=0.5)
    toxics = proxy.toxics()
    assert len(toxics) == 2 * len(TOXICS)
    lat = toxics["latency_downstream"]
    assert (lat.type, lat.stream, lat.toxicity) == ("latency", "downstream", 0.5)
    assert lat.attributes == {"latency": 10, "jitter": 1}
    assert toxics["slicer_upstream"].attributes == TOXICS["slicer"]
    with pytest.raises(ProxyExists):  # 409: toxic name taken
        proxy.add_toxic(type="latency", attributes={"latency": 1})
    with pytest.raises(InvalidToxic):  # 400: unknown type
        proxy.add_toxic(type="nope", name="x")
    assert proxy.destroy_toxic("latency_upstream")
    assert "latency_upstream" not in proxy.toxics()
    with pytest.raises(NotFound):
        proxy.destroy_toxic("latency_upstream")
    proxy.disable()
    assert tp.get_proxy("echo").enabled is False
    assert tp.reset()
    assert tp.get_proxy("echo").enabled is True
    assert proxy.toxics() == {}


def test_disable_enable_refuses_then_serves(tp, echo_upstream, net):
    proxy = tp.create(upstream=echo_upstream.address, name="echo")
    s = net.connect(proxy.listen)
    s.sendall(b"a")
    assert net.recv_exact(s, 1) == b"a"
    with proxy.down():
        assert s.recv(10) == b""  # the open connection was closed
        with pytest.raises(ConnectionRefusedError):
            net.connect(proxy.listen)
    s = net.connect(proxy.listen)  # same address again once enabled
    s.sendall(b"b")
    assert net.recv_exact(s, 1) == b"b"
    s.close()


def test_populate(tp, echo_upstream):
    specs = [{"name": f"p{i}", "listen": "127.0.0.1:0", "upstream": echo_upstream.address}
             for i in range(3)]
    created = tp.populate(specs)
    assert sorted(p.name for p in created) == ["p0", "p1", "p2"]
    assert set(tp.proxies()) == {"p0", "p1", "p2"}
    tp.destroy_all()
    assert tp.proxies() == {}
