"""A small builder for hand-made histories (the shapes chaos/workload/client.py writes)."""

from __future__ import annotations

from typing import Any

import pytest


class HistoryBuilder:
    """Appends Jepsen-style ops; times are given explicitly (s since run start)."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []

    def op(self, process: str, type_: str, f: str, t: float, phase: str = "warm", **kw: Any) -> dict[str, Any]:
        op = {"index": len(self.ops), "time": t, "process": process, "type": type_, "f": f, "phase": phase,
              "request_id": kw.pop("request_id", None), "fault_id": kw.pop("fault_id", None),
              "value": kw.pop("value", {})}
        self.ops.append(op)
        return op

    def request(self, rid: str, prompt: list[int], tokens: list[int] | None = None, *, t0: float = 0.0,
                t1: float | None = 1.0, outcome: str = "ok", local: int = 0, external: int = 0,
                lookup: str | None = None, load_failed: int = 0, preemptions: int = 0,
                tenant: str | None = None, process: str = "client-0", phase: str = "warm",
                aborted: bool = False, error: str | None = None, ttft: float | None = None,
                itl: list[float] | None = None, finish: str = "length") -> None:
        self.op(process, "invoke", "complete", t0, phase, request_id=rid,
                value={"prompt_token_ids": prompt, "prompt_len": len(prompt), "tenant": tenant,
                       "cache_salt": tenant, "stream": ttft is not None, "max_tokens": len(tokens or [])})
        if t1 is None:
            return
        value: dict[str, Any] = {"type": outcome, "token_ids": list(tokens or []), "prompt_len": len(prompt),
                                 "latency_s": t1 - t0, "ttft_s": ttft, "itl_s": list(itl or []),
                                 "aborted": aborted, "error": error}
        if outcome == "ok":
            value["finish_reason"] = finish
            value["cached_token_stats"] = {"local_cache_hit_tokens": local, "external_cache_hit_tokens": external,
                                           "lookup": lookup or ("hit" if external else "miss"),
                                           "load_failed_tokens": load_failed, "num_preemptions": preemptions}
            value["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(tokens or [])}
        self.op(process, outcome, "complete", t1, phase, request_id=rid, value=value)

    def fault(self, fid: str, kind: str, t0: float, t1: float | None, evidence: dict[str, Any] | None,
              phase: str = "stall", apply_outcome: str = "ok", trigger: dict[str, Any] | None = None,
              params: dict[str, Any] | None = None) -> None:
        params = {"link": "engine-lmcache", "latency_ms": 3000} if params is None else params
        default = kind_default_trigger(kind, params) if trigger is None else None
        self.op("nemesis", "invoke", "apply", t0, phase, fault_id=fid,
                value={"kind": kind, "params": params, **({"default_trigger": default} if default else {})})
        self.op("nemesis", apply_outcome, "apply", t0 + 0.01, phase, fault_id=fid,
                value={"kind": kind} if apply_outcome == "ok" else {"kind": kind, "error": "proxy said 500"})
        if t1 is None:
            return
        self.op("nemesis", "invoke", "heal", t1, phase, fault_id=fid, value={"kind": kind})
        value: dict[str, Any] = {"kind": kind}
        if evidence is not None:
            value["evidence"] = evidence
        if trigger is not None:
            value["trigger"] = trigger
        self.op("nemesis", "ok", "heal", t1 + 0.01, phase, fault_id=fid, value=value)

    def phase_trigger(self, phase: str, t: float, trigger: dict[str, Any]) -> None:
        """The record the runner writes when a phase's trigger has been watched."""
        self.op("nemesis", "ok", "trigger", t, phase, value={"scope": "phase", **trigger})


def kind_default_trigger(kind: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """What the runner records on a fault's apply op (chaos/runner/run.py): the kind's default
    trigger for these settings; None for ``trigger: none`` or a kind kvchaos does not know."""
    from chaos.faults import registry

    if params.get("trigger") is not None:
        return None
    registry.load_builtin_faults()
    try:
        cls = registry.get(kind)
    except KeyError:
        return None
    try:
        p = cls.params_model.model_validate({"kind": kind, **params})
    except ValueError:
        p = cls.params_model.model_construct(**{"kind": kind, **params})
    try:
        return cls.default_trigger(p).as_record(kind)
    except Exception:  # settings a constructed history leaves out
        return None


@pytest.fixture
def hb() -> HistoryBuilder:
    """A fresh history builder."""
    return HistoryBuilder()
