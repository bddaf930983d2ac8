from __future__ import annotations

import typing
from typing import Literal

import pytest

from chaos.faults import registry
from chaos.faults.base import Fault, FaultContext, FaultParams
from chaos.faults.latency import Latency, LatencyParams

NETWORK_KINDS = {"latency", "timeout", "reset_peer", "limit_data", "slicer", "bandwidth", "link_down"}


def test_builtin_kinds_are_registered():
    registry.load_builtin_faults()
    assert NETWORK_KINDS <= set(registry.kinds())
    assert registry.get("latency") is Latency
    with pytest.raises(KeyError, match="unknown fault kind 'nope'; known: .*latency"):
        registry.get("nope")


def test_build_fault_and_ids():
    params = LatencyParams(kind="latency", link="l", latency_ms=5, duration=1, name="x")
    fault = registry.build_fault(params)
    assert isinstance(fault, Latency) and fault.id == "x" and fault.kind == "latency"
    with pytest.raises(TypeError, match="needs LatencyParams"):
        Latency(FaultParams(kind="latency", duration=1))


class _P(FaultParams):
    kind: Literal["test_only"]


class _Bad(FaultParams):
    kind: str


def _fault_class(params_model):
    class F(Fault):
        def apply(self, ctx: FaultContext) -> dict:
            return {}

        def heal(self, ctx: FaultContext) -> dict:
            return {}

        def evidence(self, ctx: FaultContext) -> dict:
            return {"bit": True}

    F.params_model = params_model
    return F


def test_register_checks_the_class(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    with pytest.raises(TypeError, match="must be Literal\\['other'\\]"):
        registry.register("other")(_fault_class(_P))
    with pytest.raises(TypeError, match="must be Literal"):
        registry.register("test_only")(_fault_class(_Bad))
    with pytest.raises(TypeError, match="Fault subclass"):
        registry.register("test_only")(object)
    cls = registry.register("test_only")(_fault_class(_P))
    assert registry.get("test_only") is cls
    union = typing.get_args(registry.fault_union())[0]
    assert _P in typing.get_args(union)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("latency")(_fault_class(LatencyParams))


def test_a_new_kind_is_a_new_yaml_kind(monkeypatch):
    """Registering a kind is all it takes to accept it in a scenario (with a fresh union)."""
    import pydantic

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("test_only")(_fault_class(_P))
    adapter = pydantic.TypeAdapter(list[registry.fault_union()])
    (p,) = adapter.validate_python([{"kind": "test_only", "until": "end"}])
    assert isinstance(p, _P)
    with pytest.raises(pydantic.ValidationError):
        adapter.validate_python([{"kind": "test_only", "until": "end", "link": "x"}])


def test_common_fields():
    p = LatencyParams(kind="latency", link="l", latency_ms=5, start="2s", duration="8s")
    assert (p.start, p.duration, p.until, p.end_s(), p.stack_refs()) == (2.0, 8.0, None, 10.0, {"link": "l"})
    with pytest.raises(ValueError, match="not both"):
        LatencyParams(kind="latency", link="l", latency_ms=5, duration=1, until="end")
    with pytest.raises(ValueError, match="exactly one"):
        LatencyParams(kind="latency", link="l", latency_ms=5)
    with pytest.raises(ValueError, match="pattern"):
        LatencyParams(kind="latency", link="l", latency_ms=5, until="end", name="Bad Name")
