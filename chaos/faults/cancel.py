"""cancel: clients abort their requests (the connection is closed mid-request).

    apply ── the window opens ───────────────────────────── heal ── the window closes
               │ each request the workload starts in the window asks the runner's nemesis
               │ (Nemesis.cancel_for) -> this fault's cancel_for(plan, ctx) -> Cancel | None
               ▼
    chaos.workload.client: aborts after the first token / after N ms, records ``info`` with
    ``aborted: true``

Modes: ``after_first_token`` (streamed requests; a non-streamed request has no first token,
so it is aborted ``after_ms`` after it was sent instead), ``after_ms``, ``random`` (each
picked request is aborted at a random point: for a streamed request after its first token or
at a uniform time in [0, after_ms] ms, for a non-streamed one at a uniform time in
[0, after_ms] ms), and ``at_state``: aborted once the engine reports the request entered
``state`` (``lookup``: its LMCache lookup is in flight; ``load``: LMCache chunks are being
retrieved after a positive lookup; ``prefill``; ``decode``), read from the engine's stage
watch (the reference engine's ``GET /debug/requests/{id}?wait_for=STAGE``), after which the
client asks the engine where the abort landed. ``probability`` picks which requests are
aborted (seeded); ``storm`` aborts every request started in the window. The engine must end
each aborted request's lookup, locks and session (field report F9: an abort between prefix
match and load-back leaked a pending lookup, read locks and the session).

Where each abort landed is asked of the engine after it (its request view; an engine without
one answers 404 and the abort is counted as not located), for every mode.

Evidence: requests aborted while the window was open; with ``at_state``, only aborts the
engine says landed in that state count (``landed``: stage -> aborts), so a window where no
request reached the state (a lookup that never went out, a load that never happened) or every
abort landed later is inconclusive, never "bitten".
"""

from __future__ import annotations

import threading
from typing import Any, Literal, Sequence

from pydantic import Field, model_validator

from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams
from chaos.faults.registry import get as get_fault
from chaos.faults.registry import register
from chaos.workload.client import Cancel

__all__ = ["CancelParams", "CancelFault", "aborted_in_window", "landings"]


class CancelParams(FaultParams):
    """Clients abort requests started while the fault is active."""

    kind: Literal["cancel"]
    mode: Literal["after_first_token", "after_ms", "random", "at_state"] = Field(
        default="after_first_token",
        description="when a picked request is aborted: after its first token (streamed; "
        "non-streamed requests fall back to after_ms), after_ms milliseconds after it was sent, "
        "at a random point, or at_state: once the engine reports it in `state`",
    )
    state: Literal["lookup", "load", "prefill", "decode"] | None = Field(
        default=None,
        description="mode at_state: the request state to abort in: lookup (LMCache lookup in flight), "
        "load (retrieving LMCache chunks after a positive lookup), prefill, decode; needs an engine with "
        "a stage watch (the reference engine's /debug/requests/{id})",
    )
    after_ms: float = Field(
        default=50.0, ge=0.0,
        description="milliseconds after sending at which to abort (mode after_ms, and non-streamed "
        "requests in the other modes; the upper bound of the random point in mode random)",
    )
    probability: float = Field(
        default=1.0, ge=0.0, le=1.0,
        description="chance 0..1 that a request started in the window is aborted (seeded)",
    )
    storm: bool = Field(
        default=False, description="abort every request started in the window, whatever probability says"
    )

    @model_validator(mode="after")
    def _state_with_at_state(self) -> CancelParams:
        if (self.mode == "at_state") != (self.state is not None):
            raise ValueError("mode at_state needs `state` (lookup, load, prefill or decode)"
                             if self.mode == "at_state" else "`state` is only for mode at_state")
        return self


def aborted_in_window(ops: list[Any], start: float, end: float, also: set[str] | None = None) -> list[str]:
    """Request ids aborted on purpose whose invoke falls in ``[start, end]`` (history seconds).

    Args:
        ops: history ops (chaos.history.Op), in order.
        start, end: the window, in history seconds.
        also: ids counted whatever their invoke time (requests the fault picked just as the
            window closed are recorded a moment after it).
    """
    also = also or set()
    invoked: dict[str, float] = {}
    out = []
    for op in ops:
        if op.f != "complete" or op.request_id is None:
            continue
        if op.type == "invoke":
            invoked[op.request_id] = op.time
        elif op.type == "info" and op.value.get("aborted"):
            t = invoked.get(op.request_id)
            if op.request_id in also or (t is not None and start <= t <= end):
                out.append(op.request_id)
    return out


def landings(ops: list[Any], ids: list[str]) -> dict[str, Any]:
    """Where the stage-aimed cancels of ``ids`` landed, from their ``info`` ops' ``cancel`` value.

    Returns:
        ``{"landed": {stage: n}, "never_reached": [ids], "unlanded": [ids]}``: ``landed`` counts
        aborts by the engine's stage when the abort reached it; ``never_reached``: requests that
        ended (or were not watchable) without entering the target stage; ``unlanded``: aborted
        but the engine recorded no abort (it ended first).
    """
    want = set(ids)
    landed: dict[str, int] = {}
    never: list[str] = []
    unlanded: list[str] = []
    for op in ops:
        if op.f != "complete" or op.type == "invoke" or op.request_id not in want:
            continue
        c = op.value.get("cancel") or {}
        if not c.get("reached"):
            never.append(op.request_id)
        elif c.get("landed_in"):
            landed[c["landed_in"]] = landed.get(c["landed_in"], 0) + 1
        else:
            unlanded.append(op.request_id)
    return {"landed": landed, "never_reached": never, "unlanded": unlanded}


@register("cancel")
class CancelFault(Fault):
    """Open a window at apply, close it at heal; in between, pick requests to abort."""

    params_model = CancelParams
    params: CancelParams

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """The abort landed where it aimed (the fault's evidence): with ``at_state``, in that
        state as the engine reports it; otherwise a request aborted before its answer ended."""
        state = getattr(params, "state", None)
        if getattr(params, "mode", None) == "at_state":
            return DefaultTrigger("evidence", f"an abort landed in state {state}, as the engine reports "
                                  "(the fault's evidence)")
        return DefaultTrigger("evidence", "a request of the window was aborted before its answer was "
                              "complete (the fault's evidence)")

    @classmethod
    def default_trigger_beside(cls, params: FaultParams, beside: Sequence[FaultParams] = ()) -> DefaultTrigger:
        """Beside a fault that holds LMCache's answers (a slowed or cut link of LMCache's path, a
        frozen LMCache or Redis: ``Fault.holds_lmcache_answers``), a cancel that names no state
        aims at the requests' LMCache calls, the window of field report F9 (an abort between the
        lookup and the load): its default trigger is then an abort the engine says landed while
        the request's lookup or load was in flight (evidence ``landed_in_lmcache_call``; needs
        the engine's request view). An abort that landed in decode after a fast lookup never
        reached that window: the run is inconclusive, not passed. ``mode: at_state`` aims
        exactly and keeps its own default."""
        if getattr(params, "mode", None) != "at_state":
            holders = sorted({b.kind for b in beside if get_fault(b.kind).holds_lmcache_answers(b)})
            if holders:
                return DefaultTrigger(
                    "evidence", "an abort landed while the request's LMCache lookup or load was in flight, as "
                    f"the engine reports (a cancel beside {', '.join(holders)}, which hold LMCache's answers)",
                    needs=frozenset({"engine.debug_state"}), evidence_field="landed_in_lmcache_call")
        return cls.default_trigger(params)

    @classmethod
    def capability_needs(cls, params: FaultParams) -> set[str]:
        """``mode: at_state`` needs the engine to report request states (the reference engine's
        ``GET /debug/requests/{id}``, part of its debug state); the other modes need nothing."""
        assert isinstance(params, CancelParams)
        return {"engine.debug_state"} if params.mode == "at_state" else set()

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._lock = threading.Lock()
        self._open = False
        self._opened_at: float | None = None
        self._closed_at: float | None = None
        self._seen = 0
        self._picked: list[str] = []

    def _now(self, ctx: FaultContext) -> float | None:
        return ctx.history.now() if ctx.history is not None else None

    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Open the cancel window (the history clock time is recorded for the evidence)."""
        with self._lock:
            self._open = True
            self._opened_at = self._now(ctx)
        return {"window": "open", "mode": self.params.mode, "storm": self.params.storm}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Close the window; requests already told to abort still do."""
        with self._lock:
            was_open = self._open
            self._open = False
            if was_open:
                self._closed_at = self._now(ctx)
        return {"window": "closed", "requests_seen": self._seen, "aborts_picked": len(self._picked)}

    def cancel_for(self, plan: Any, ctx: FaultContext) -> Cancel | None:
        """The Cancel for a request about to start (a ``chaos.workload.generator.TurnPlan``),
        or None when the window is closed or the request is not picked."""
        p = self.params
        with self._lock:
            if not self._open:
                return None
            self._seen += 1
            if not p.storm and ctx.rng.random() >= p.probability:
                return None
            self._picked.append(plan.request_id)
            mode = p.mode
            if mode == "at_state":
                return Cancel(at_state=p.state)
            if mode == "random":
                if plan.stream and ctx.rng.random() < 0.5:
                    return Cancel(after_first_token=True, report_landing=True)
                return Cancel(after_ms=ctx.rng.uniform(0.0, p.after_ms), report_landing=True)
        if mode == "after_first_token" and plan.stream:
            return Cancel(after_first_token=True, report_landing=True)
        return Cancel(after_ms=p.after_ms, report_landing=True)

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when the history holds at least one request aborted on purpose that was invoked
        while the window was open; with mode at_state, one whose abort the engine says landed in
        ``state``."""
        if ctx.history is None or self._opened_at is None:
            return {"bit": False, "aborted": 0, "reason": "no history to read"}
        end = self._closed_at if self._closed_at is not None else ctx.history.now()
        ids = aborted_in_window(ctx.history.ops, self._opened_at, end, set(self._picked))
        out: dict[str, Any] = {"bit": bool(ids), "aborted": len(ids), "picked": len(self._picked),
                               "requests_seen": self._seen, "window_s": [self._opened_at, end],
                               "aborted_ids": ids[:50]}
        seen = landings(ctx.history.ops, list(self._picked))
        if self.params.mode == "at_state":
            state = self.params.state
            hit = seen["landed"].get(state, 0)
            out.update({"state": state, "landed": seen["landed"], "landed_in_state": hit,
                        "never_reached": len(seen["never_reached"]), "unlanded": len(seen["unlanded"]),
                        "bit": hit > 0})
            if hit == 0:
                if not self._picked:
                    out["reason"] = ("no request started while the window was open" if not self._seen
                                     else f"no request was picked (probability {self.params.probability:g})")
                elif seen["landed"]:
                    out["reason"] = (f"no abort landed in state {state}: they landed in "
                                     + ", ".join(f"{k} ({v})" for k, v in sorted(seen["landed"].items())))
                else:
                    out["reason"] = (f"no picked request reached state {state} "
                                     f"({len(seen['never_reached'])} never entered it, "
                                     f"{len(seen['unlanded'])} ended before the abort arrived)")
            return out
        out.update({"landed": seen["landed"], "unlanded": len(seen["unlanded"]),
                    "landed_in_lmcache_call": sum(seen["landed"].get(s, 0) for s in ("lookup", "load"))})
        if not ids:
            out["reason"] = ("no request started while the window was open" if not self._seen
                             else f"no request was picked (probability {self.params.probability:g})"
                             if not self._picked else "no picked request was aborted (they finished first)")
        return out
