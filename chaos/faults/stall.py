"""stall: the engine holds its scheduler at a point of a request's path (its own fault hook).

    apply ── POST <engine_url>/hooks/stall {point, seconds, count}
                 the engine sleeps ``seconds`` at ``point`` the next ``count`` times it gets
                 there: ``before_lookup`` (a request about to ask LMCache), ``before_retrieve``
                 (a positive lookup about to be loaded), ``before_store``
    heal  ── the stalls not yet used are cleared (a stall of 0 s: the engine drops what is pending)

Opens a timing window for another fault of the same phase to land in (a slow link while the
engine is held before a retrieve, a frozen server between lookup and load). The reference
engine's hook (chaos/engine/api.py); it logs ``hook: stalling <s>s at <point>`` each time it
holds (chaos/engine/scheduler.py ``EngineCore._stall``).

Evidence: the engine's log lines saying it held at ``point`` while the fault was in place,
read at heal; bit when there was at least one. A stall that was armed but never reached (no
request got to the point: no positive lookup before a retrieve) did not bite. The log is the
engine's own, on every backend (chaos.probes.LogCursor).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import httpx
from pydantic import Field

from chaos.duration import PositiveDuration
from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams
from chaos.faults.kill import require_stack
from chaos.faults.registry import register
from chaos.httppool import ssl_context
from chaos.probes import LogCursor, ProbeError

__all__ = ["StallParams", "Stall", "STALL_POINTS", "stall_line", "arm_stall", "clear_stall"]

#: The reference engine's stall points (chaos/engine/scheduler.py STALL_POINTS).
STALL_POINTS = ("before_lookup", "before_retrieve", "before_store")
#: The engine hook's bound on ``seconds`` (chaos/engine/protocol.py StallHook).
MAX_STALL_S = 120.0


def stall_line(point: str) -> re.Pattern[str]:
    """The engine's log line for one hold at ``point``: ``hook: stalling <s>s at <point>``,
    not a 0 s one (an engine that queues the 0 s stall :func:`clear_stall` sends, instead of
    dropping what is pending as the reference engine does, logs it when it is reached)."""
    return re.compile(rf"hook: stalling (?!0\.00s)[0-9.]+s at {re.escape(point)}\b")


def arm_stall(engine_url: str, point: str, seconds: float, count: int, *, timeout_s: float = 10.0) -> Any:
    """``POST {engine_url}/hooks/stall``: hold ``seconds`` at ``point`` the next ``count`` times.

    Returns:
        the engine's JSON answer (``{"point", "seconds", "count"}``).

    Raises:
        httpx.HTTPError: the engine did not answer or refused (an engine without the hook: 404).
    """
    r = httpx.post(f"{engine_url.rstrip('/')}/hooks/stall", timeout=timeout_s, verify=ssl_context(),
                   json={"point": point, "seconds": seconds, "count": count})
    r.raise_for_status()
    return r.json()


def clear_stall(engine_url: str, point: str) -> int | str:
    """Clear the stalls still pending at ``point``: a stall of 0 s, which the reference engine
    takes as "drop what is pending" (the hook replaces what is pending; it takes no count of 0).
    Never raises.

    Returns:
        the HTTP status, or the error in words.
    """
    try:
        return httpx.post(f"{engine_url.rstrip('/')}/hooks/stall", timeout=10, verify=ssl_context(),
                          json={"point": point, "seconds": 0, "count": 1}).status_code
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"


class StallParams(FaultParams):
    """Hold the engine at ``point`` for ``seconds``, the next ``count`` times."""

    kind: Literal["stall"]
    point: Literal["before_lookup", "before_retrieve", "before_store"] = Field(
        default="before_retrieve", description="where the engine holds: before_lookup (before asking LMCache), "
        "before_retrieve (after a positive lookup, before the load), before_store")
    seconds: PositiveDuration = Field(
        default=2.0, le=MAX_STALL_S, description="how long each hold lasts (duration, at most 120s)")
    count: int = Field(default=1, ge=1, le=1000, description="how many times the engine holds (one request each)")


@register("stall")
class Stall(Fault):
    """Arm the engine's stall hook at apply; count its holds in the engine's log at heal."""

    params_model = StallParams
    params: StallParams
    needs = ("engine.hooks.stall",)

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """The engine held a request at the stall's point (its log line: the fault's evidence)."""
        return DefaultTrigger("evidence", f"the engine held a request at {getattr(params, 'point', 'its point')} "
                              "(its log; the fault's evidence)")

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._cursor: LogCursor | None = None
        self._engine_url = ""
        self._armed: Any = None
        self._held: int | None = None
        self._error: str | None = None

    def _count(self) -> int | None:
        if self._cursor is None:
            return None
        try:
            return len(stall_line(self.params.point).findall(self._cursor.new_text()))
        except ProbeError as exc:
            self._error = str(exc)
            return None

    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Mark the engine's log, then arm the hook.

        Raises:
            RuntimeError: no stack, or it names no engine (x-kvchaos.engine, engine_url);
            httpx.HTTPError: the engine refused the hook.
        """
        stack = require_stack(ctx)
        s = stack.settings
        if not s.engine_url or not s.engine:
            raise RuntimeError("stall needs the stack's engine (x-kvchaos.engine, engine_url)")
        self._engine_url = s.engine_url
        self._cursor = LogCursor(stack, s.engine)
        self._cursor.mark()
        self._armed = arm_stall(s.engine_url, self.params.point, self.params.seconds, self.params.count)
        return {"armed": self._armed}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Count the holds so far, then clear the stalls not used (also after a failed apply)."""
        self._held = self._count()
        cleared = None
        if self._armed is not None and (self._held is None or self._held < self.params.count):
            cleared = clear_stall(self._engine_url, self.params.point)
        return {"held": self._held, "stalls_cleared": cleared}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when the engine logged at least one hold at ``point`` while in place."""
        held = self._held if self._held is not None else self._count()
        out: dict[str, Any] = {"bit": bool(held), "point": self.params.point, "held": held,
                               "count": self.params.count, "source": "engine log 'hook: stalling <s>s at <point>'"}
        if self._armed is None:
            out["reason"] = "the stall was never armed"
        elif held is None:
            out["reason"] = f"the engine's log could not be read: {self._error}"
        elif not held:
            out["reason"] = f"no request reached {self.params.point} while the stall was armed"
        return out
