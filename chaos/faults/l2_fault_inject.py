"""l2_fault_inject: LMCache's own ``fault_inject`` L2 adapter wrapped around the stack's L2 tiers.

    stack file (lmcache service):   --l2-adapter '${LMCACHE_L2_FS_WRAP:-}{"type": "fs", ...}${LMCACHE_L2_FS_WRAP_END:-}'
    apply: LMCACHE_L2_FS_WRAP='{"type": "fault_inject", "rate": R, "seed": S, "gap_indices": [..],
                                "gap_tail_ratios": [..], "inner": '   LMCACHE_L2_FS_WRAP_END='}'
           -> stack.reconfigure: the lmcache service restarts with the wrapped adapter (its L1 is
              empty after the restart; the L2 tiers keep their objects)
    heal:  the variables back as they were -> lmcache restarts with the plain adapters
    after each restart: wait until the engine has re-registered with the new server and uses it
              again (chaos/stack/reconnect.py; at most ``settle``)

LMCache 0.5.6's ``FaultInjectL2Adapter`` (``v1/distributed/l2_adapters/fault_inject_l2_adapter.py``)
passes stores and lookups through to the inner adapter and clears the bits of some keys in the
*load* result: the key is reported present at lookup and its load fails, "the faithful L2
retrieve error" (field reports F3, F4). Which keys: a stable hash of the key bucketed by
``rate`` (seeded by ``seed``: the same keys fail on every load), plus exact positions of each
load batch (``gap_indices`` from the head, ``gap_tail_ratios`` as a fraction from the tail).
LMCache's prefetch controller deletes the failed staging buffers, releases their locks, and
publishes ``L2_PREFETCH_FAILED`` (reason ``not_found``), counted on ``/metrics`` as
``lmcache_mp_l2_prefetch_failure_chunks_total``.

Only an ``--l2-adapter`` argument written as ``${A:-}<json>${B:-}`` (two stack variables around
the adapter's JSON, both empty by default) can be wrapped: a compose variable's default cannot
hold JSON (its ``}`` would end the variable), so the wrapper is what the variables add.

Evidence: the restarted server reports the wrapper on every adapter asked for (``/status``
``storage_manager.l2_adapters[*].fault_inject``) and LMCache counted at least one load failure
while it was in place.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import Field, model_validator

from chaos.duration import Duration
from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams
from chaos.faults.kill import require_stack
from chaos.faults.registry import register
from chaos.probes import ProbeError, read_metric
from chaos.stack.reconnect import RECONNECT_TIMEOUT_S

__all__ = ["L2FaultInjectParams", "L2FaultInject", "WrappableAdapter", "wrappable_adapters",
           "LOAD_FAILURES"]

#: LMCache 0.5.6 (v1/mp_observability/subscribers/metrics/l2_failures.py), on the HTTP port's /metrics.
LOAD_FAILURES = "lmcache_mp_l2_prefetch_failure_chunks_total"

_WRAPPED = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*):?-\}(.*)\$\{([A-Za-z_][A-Za-z0-9_]*):?-\}$", re.S)


class L2FaultInjectParams(FaultParams):
    """Restart LMCache with its fault_inject adapter around the stack's L2 adapters; undo at heal."""

    kind: Literal["l2_fault_inject"]
    adapters: list[str] | None = Field(
        default=None, min_length=1,
        description="LMCache adapter types to wrap, as in the stack's --l2-adapter list (fs, resp, ...); "
        "default: every adapter the stack lets a fault wrap",
    )
    rate: float = Field(default=0.0, ge=0.0, le=1.0,
                        description="share 0..1 of keys whose loads fail (a stable per-key hash)")
    seed: int = Field(default=0, description="seed of that per-key hash: the same seed fails the same keys")
    gap_indices: list[int] = Field(default_factory=list,
                                   description="positions (from 0, from the head) of each load batch that always fail")
    gap_tail_ratios: list[float] = Field(
        default_factory=list,
        description="positions of each load batch that always fail, as distance from the tail over the "
        "batch length, 0..1 (0: the last chunk, 1: the first)")
    settle: Duration = Field(
        default=RECONNECT_TIMEOUT_S,
        description="the longest wait, after each LMCache restart, for the engine's client to "
        "reconnect: LMCache lists its KV caches again and (reference engine) the engine reports "
        "LMCache healthy (chaos/stack/reconnect.py), e.g. 30s")

    @model_validator(mode="after")
    def _something_fails(self) -> L2FaultInjectParams:
        if self.rate == 0 and not self.gap_indices and not self.gap_tail_ratios:
            raise ValueError("nothing would fail: give rate > 0, gap_indices or gap_tail_ratios")
        if any(i < 0 for i in self.gap_indices):
            raise ValueError("gap_indices must be >= 0")
        if any(not 0.0 <= r <= 1.0 for r in self.gap_tail_ratios):
            raise ValueError("gap_tail_ratios must be within 0..1")
        return self

    def adapter_spec(self) -> dict[str, Any]:
        """The fault_inject adapter's JSON fields (all but ``inner``)."""
        return {"type": "fault_inject", "rate": self.rate, "seed": self.seed, "gap_indices": self.gap_indices,
                "gap_tail_ratios": self.gap_tail_ratios}


@dataclass(frozen=True)
class WrappableAdapter:
    """An ``--l2-adapter`` of the stack's LMCache service that a fault can wrap."""

    index: int  # position among the service's --l2-adapter arguments
    type: str  # LMCache adapter type of the inner JSON
    inner: dict[str, Any]  # the adapter's JSON, interpolated
    before: str  # the variable in front of the JSON
    after: str  # the variable behind it


def wrappable_adapters(stack: Any) -> list[WrappableAdapter]:
    """The ``--l2-adapter`` arguments of the stack's LMCache service written as
    ``${A:-}<json>${B:-}``.

    Raises:
        RuntimeError: the stack names no LMCache service, or its command is not a list.
    """
    from chaos.stack.interpolate import interpolate
    from chaos.yamlsource import load_yaml

    service = stack.settings.lmcache
    if not service:
        raise RuntimeError("l2_fault_inject needs the stack's LMCache service (x-kvchaos.lmcache)")
    raw, _ = load_yaml(stack.spec.path)
    svc = (raw.get("services") or {}).get(service) or {}
    command = (svc.get("x-kvchaos-local") or {}).get("command") if stack.backend == "local" else None
    command = command or svc.get("command")
    if not isinstance(command, list):
        raise RuntimeError(f"l2_fault_inject: the command of service {service!r} must be a list to find "
                           "its --l2-adapter arguments")
    out: list[WrappableAdapter] = []
    n = 0
    for prev, arg in zip(command, command[1:]):
        if prev != "--l2-adapter":
            continue
        m = _WRAPPED.match(str(arg))
        if m:
            try:
                inner = json.loads(interpolate(m.group(2), stack.env))
            except ValueError:
                inner = None
            if isinstance(inner, dict) and isinstance(inner.get("type"), str):
                out.append(WrappableAdapter(n, inner["type"], inner, m.group(1), m.group(3)))
        n += 1
    return out


def _status_adapters(lmcache_http: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{lmcache_http.rstrip('/')}/status", timeout=10)
    r.raise_for_status()
    return list((r.json().get("storage_manager") or {}).get("l2_adapters") or [])


@register("l2_fault_inject")
class L2FaultInject(Fault):
    """Wrap the chosen L2 adapters in LMCache's fault_inject adapter (an LMCache restart), and
    unwrap them at heal (another restart)."""

    params_model = L2FaultInjectParams
    params: L2FaultInjectParams

    #: the wrapped --l2-adapter arguments, and LMCache's /status and /metrics for the evidence
    needs = ("lmcache.l2_wrap", "lmcache.http")

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """LMCache counted a load from a wrapped adapter that failed (the fault's evidence)."""
        return DefaultTrigger("evidence", "LMCache counted a failed load from the wrapped L2 adapter "
                              "(the fault's evidence)")

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._saved: dict[str, str] | None = None
        self._targets: list[WrappableAdapter] = []
        self._active: list[dict[str, Any]] = []
        self._restarted: list[str] = []
        self._before: float | None = None
        self._after: float | None = None
        self._metrics_error: str | None = None

    def _failures(self, lmcache_http: str) -> float | None:
        try:
            value, _seen = read_metric(f"{lmcache_http.rstrip('/')}/metrics", LOAD_FAILURES, {"reason": "not_found"})
        except ProbeError as exc:
            self._metrics_error = str(exc)
            return None
        return value  # OTel counters appear on their first increment: absent is 0

    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Set the wrap variables, restart LMCache, check it reports the wrapper, wait for the
        engine to reconnect (at most ``settle``).

        Raises:
            RuntimeError: no stack; no wrappable adapter (or none of the types asked for).
            StackError: LMCache did not come back healthy; httpx.HTTPError: its /status did not answer.
        """
        stack = require_stack(ctx)
        s = stack.settings
        found = wrappable_adapters(stack)
        want = self.params.adapters
        self._targets = [a for a in found if want is None or a.type in want]
        missing = sorted(set(want or []) - {a.type for a in self._targets})
        if not self._targets or missing:
            have = ", ".join(f"{a.type} (${{{a.before}}}...${{{a.after}}})" for a in found) or "none"
            raise RuntimeError(
                f"l2_fault_inject: no wrappable --l2-adapter {'of type ' + ', '.join(missing) if missing else ''} "
                f"in service {s.lmcache!r} (wrappable: {have}); write the argument as "
                "'${NAME_WRAP:-}{\"type\": ...}${NAME_WRAP_END:-}' (docs/reach.md)")
        spec = json.dumps(self.params.adapter_spec())
        variables: dict[str, str] = {}
        for a in self._targets:
            variables[a.before] = spec[:-1] + ', "inner": '
            variables[a.after] = "}"
        self._saved = {k: stack.env.get(k, "") for k in variables}
        stack.last_reconnect = None
        self._restarted = stack.reconfigure(variables, reconnect_timeout_s=self.params.settle)
        back = stack.last_reconnect
        self._active = [a for a in _status_adapters(s.lmcache_http) if "fault_inject" in a]
        self._before = self._failures(s.lmcache_http)
        return {"adapters": [a.type for a in self._targets], "restarted": self._restarted,
                "active": len(self._active), "fault_inject": self.params.adapter_spec(), "engine": back}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Read LMCache's load failures, then put the variables back, restart LMCache and wait for
        the engine to reconnect (at most ``settle``)."""
        if self._saved is None or ctx.stack is None:
            return {"restored": False, "reason": "not applied"}
        s = ctx.stack.settings
        self._after = self._failures(s.lmcache_http) if s.lmcache_http else None
        ctx.stack.last_reconnect = None
        restarted = ctx.stack.reconfigure(self._saved, reconnect_timeout_s=self.params.settle)
        back = ctx.stack.last_reconnect
        self._saved = None
        return {"restored": True, "restarted": restarted, "engine": back}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when LMCache reported the wrapper on every adapter asked for and counted at least
        one load failure (``reason="not_found"``) while it was in place."""
        failed = None if self._before is None or self._after is None else self._after - self._before
        active = len(self._active) >= len(self._targets) > 0
        out: dict[str, Any] = {"bit": bool(active and failed is not None and failed >= 1),
                               "adapters": [a.type for a in self._targets], "wrapper_active": active,
                               "lmcache_load_failures": failed, "source": f"lmcache /metrics {LOAD_FAILURES}"}
        if not out["bit"]:
            out["reason"] = ("LMCache did not report the fault_inject adapter" if not active
                             else f"LMCache's /metrics did not answer: {self._metrics_error}" if failed is None
                             else "no load from a wrapped adapter failed (nothing was loaded from L2?)")
        return out
