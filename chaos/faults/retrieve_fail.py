"""retrieve_fail: the engine's retrieve (load) after a positive lookup fails, every time.

    apply ── POST <engine_url>/hooks/stall {point: before_retrieve, seconds: hold, count}
                 the engine stops right before each of its next ``count`` retrieves, i.e. after
                 its lookup answered a hit
    each round (a watcher thread, driven by what the engine says, not by a timer):
      engine log "hook: stalling ... at before_retrieve"  ──> break the path: LMCache paused
                 (``break_with: pause``) or the engine->LMCache link disabled (``link_down``)
      engine /metrics kvchaos_engine_load_failures_total grew  ──> the retrieve failed: mend
                 the path (resume / enable), wait for the next round
    heal  ── the path mended, the engine's remaining stalls cleared

Field reports F3 (an L2 transfer fails after a positive lookup and the error is dropped) and F7
(the object is gone between lookup and load). The engine must count the failed load and
recompute, never use the blocks it did not receive. The break is applied when the engine is seen
held, and mended when the engine has counted the failure, so the failure does not depend on
the two timings lining up; ``hold`` is only the margin for the break to land (the log is read
every 20 ms).

Needs the reference engine's hook ``/hooks/stall`` (chaos/engine/api.py), its log line
``hook: stalling <s> at before_retrieve`` and its counter ``kvchaos_engine_load_failures_total``
(docs/reach.md); on an engine without them apply fails with the engine's answer.

Evidence: rounds in which the engine was held, the path broken while it was held, and the engine
counted the failed load; bit when at least one round did.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Literal

import httpx
from pydantic import Field

from chaos.duration import PositiveDuration
from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams
from chaos.faults.kill import require_stack
from chaos.faults.registry import register
from chaos.faults.stall import arm_stall, clear_stall, stall_line
from chaos.probes import LogCursor, ProbeError, read_metric

__all__ = ["RetrieveFailParams", "RetrieveFail", "STALL_LINE", "LOAD_FAILURES"]

#: The reference engine's log line when its stall hook holds it (chaos/engine/scheduler.py); not
#: the 0 s stall that heal leaves to clear the hook (its API takes count >= 1).
STALL_LINE = stall_line("before_retrieve")
#: The reference engine's count of retrieves that failed (chaos/engine/metrics.py).
LOAD_FAILURES = "kvchaos_engine_load_failures_total"
_POLL_S = 0.02


class RetrieveFailParams(FaultParams):
    """Fail the engine's next ``count`` retrieves after positive lookups."""

    kind: Literal["retrieve_fail"]
    count: int = Field(default=1, ge=1, description="retrieves to fail, one after the other")
    hold: PositiveDuration = Field(
        default=2.0, description="how long the engine is held before each retrieve: the margin for the "
        "break to land (e.g. 2s)")
    break_with: Literal["pause", "link_down"] = Field(
        default="pause", description="how the retrieve is made to fail: pause freezes the stack's LMCache "
        "(the request is never answered: MQ timeout); link_down disables `link` (connection closed)")
    link: str = Field(default="engine-lmcache", description="the link disabled by break_with: link_down")
    fail_within: PositiveDuration = Field(
        default=15.0, description="how long a round waits for the engine to count the failed load "
        "before it mends the path anyway")

    def stack_refs(self) -> dict[str, str]:
        return {"link": self.link} if self.break_with == "link_down" else {}


@register("retrieve_fail")
class RetrieveFail(Fault):
    """Hold the engine before its retrieves; break the path while it is held; mend it once the
    engine counted the failure."""

    params_model = RetrieveFailParams
    params: RetrieveFailParams
    #: the stall hook holds the engine; its counter says when the load failed (and its log line,
    #: which every stack has, when it is held)
    needs = ("engine.hooks.stall", "engine.metrics")

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """The engine counted a failed load while its path was broken (the fault's evidence)."""
        return DefaultTrigger("evidence", "the engine counted a failed load while its retrieve path was "
                              "broken (the fault's evidence)")

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._broken = False
        self._rounds: list[dict[str, Any]] = []
        self._errors: list[str] = []
        self._armed = False
        self._ctx: FaultContext | None = None
        self._engine_url = ""
        self._t0 = 0.0

    # --- the path -------------------------------------------------------------------------
    def _break(self, ctx: FaultContext) -> None:
        with self._lock:
            if self.params.break_with == "pause":
                ctx.stack.pause(ctx.stack.settings.lmcache)
            else:
                from chaos.faults.network import require_proxy

                require_proxy(ctx).update_proxy(self.params.link, enabled=False)
            self._broken = True

    def _mend(self, ctx: FaultContext) -> None:
        with self._lock:
            if not self._broken:
                return
            if self.params.break_with == "pause":
                ctx.stack.resume(ctx.stack.settings.lmcache)
            else:
                from chaos.faults.network import require_proxy

                require_proxy(ctx).update_proxy(self.params.link, enabled=True)
            self._broken = False

    def _failures(self, client: httpx.Client) -> float | None:
        try:
            value, _ = read_metric(f"{self._engine_url}/metrics", LOAD_FAILURES, client=client)
        except ProbeError as exc:
            if len(self._errors) < 10:
                self._errors.append(str(exc))
            return None
        return value

    def _now(self) -> float:
        return round(time.monotonic() - self._t0, 3)

    def _watch(self, ctx: FaultContext, cursor: LogCursor, base: float) -> None:
        client = httpx.Client()
        try:
            failures_seen = base
            for i in range(self.params.count):
                # 1. the engine is held before its retrieve (its lookup answered a hit)
                while not self._stop.is_set():
                    try:
                        held = len(STALL_LINE.findall(cursor.new_text()))
                    except ProbeError as exc:
                        self._errors.append(str(exc))
                        held = 0
                    if held > i:
                        break
                    self._stop.wait(_POLL_S)
                if self._stop.is_set():
                    return
                row: dict[str, Any] = {"held_at": self._now()}
                self._rounds.append(row)
                # 2. break the path while it is held
                try:
                    self._break(ctx)
                    row["broken_at"] = self._now()
                except Exception as exc:
                    row["error"] = f"break: {type(exc).__name__}: {exc}"
                    return
                # 3. the engine counts the failed retrieve; then mend the path
                deadline = time.monotonic() + self.params.hold + self.params.fail_within
                while not self._stop.is_set() and time.monotonic() < deadline:
                    now = self._failures(client)
                    if now is not None and now > failures_seen:
                        failures_seen = now
                        row["failed_at"] = self._now()
                        break
                    self._stop.wait(0.1)
                row["failed"] = "failed_at" in row
                try:
                    self._mend(ctx)
                    row["mended_at"] = self._now()
                except Exception as exc:
                    row["error"] = f"mend: {type(exc).__name__}: {exc}"
                    return
        finally:
            client.close()

    # --- fault ----------------------------------------------------------------------------
    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Arm the engine's stall hook and start the watcher.

        Raises:
            RuntimeError: no stack, the stack has no engine URL or LMCache service (pause), or no
                proxy (link_down); httpx.HTTPError: the engine refused the hook.
        """
        stack = require_stack(ctx)
        s = stack.settings
        if not s.engine_url or not s.engine:
            raise RuntimeError("retrieve_fail needs the stack's engine (x-kvchaos.engine, engine_url)")
        if self.params.break_with == "pause" and not s.lmcache:
            raise RuntimeError("retrieve_fail with break_with: pause needs x-kvchaos.lmcache")
        if self.params.break_with == "link_down":
            from chaos.faults.network import require_proxy

            require_proxy(ctx)
        self._ctx = ctx
        self._t0 = time.monotonic()
        self._engine_url = s.engine_url.rstrip("/")
        cursor = LogCursor(stack, s.engine)
        cursor.mark()
        with httpx.Client() as client:
            base = self._failures(client)
            if base is None:
                raise RuntimeError(f"retrieve_fail: the engine's {LOAD_FAILURES} could not be read: "
                                   f"{self._errors[-1] if self._errors else ''}")
        armed = arm_stall(self._engine_url, "before_retrieve", self.params.hold, self.params.count)
        self._armed = True
        self._thread = threading.Thread(target=self._watch, args=(ctx, cursor, base),
                                        name=f"retrieve_fail-{self.id}", daemon=True)
        self._thread.start()
        return {"armed": armed, "break_with": self.params.break_with, "failures_before": base}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Stop the watcher, mend the path, clear the engine's remaining stalls."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        mend_error = None
        try:
            self._mend(ctx)
        except Exception as exc:
            mend_error = f"{type(exc).__name__}: {exc}"
        cleared = None
        if self._armed and self._engine_url and len(self._rounds) < self.params.count:
            cleared = clear_stall(self._engine_url, "before_retrieve")
        if mend_error:
            raise RuntimeError(f"retrieve_fail: could not mend the path: {mend_error}")
        return {"rounds": len(self._rounds), "stalls_cleared": cleared}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when in at least one round the engine was held, the path broken while it was
        held, and the engine counted the failed retrieve."""
        failed = [r for r in self._rounds if r.get("failed")]
        out: dict[str, Any] = {"bit": bool(failed), "held": len(self._rounds), "failed_retrieves": len(failed),
                               "rounds": self._rounds, "break_with": self.params.break_with}
        if self._errors:
            out["errors"] = self._errors[-3:]
        if not failed:
            out["reason"] = ("the engine was never held before a retrieve (no positive lookup while in place?)"
                             if not self._rounds else "the engine counted no failed retrieve while the path was broken")
        return out
