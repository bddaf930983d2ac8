"""pause: a gray failure: the service is frozen (SIGSTOP / ``docker pause``) but not dead.

    apply ── stack.pause(service)  (LocalStack: SIGSTOP to the process group, journalled
             as ``paused`` so ``kvchaos cleanup`` resumes it after a killed run)
    heal  ── stack.resume(service) (SIGCONT / ``docker unpause``)

Connections stay open and nothing answers: clients see timeouts, not resets. Evidence: the
service's processes were seen in state *stopped* (psutil) at apply and still at heal.
"""

from __future__ import annotations

import os
import time
from typing import Any, Literal

import psutil
from pydantic import Field

from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams
from chaos.faults.kill import require_stack
from chaos.faults.registry import register

__all__ = ["PauseParams", "Pause", "frozen_state"]


class PauseParams(FaultParams):
    """Freeze a service (SIGSTOP / docker pause) until heal."""

    kind: Literal["pause"]
    service: str = Field(min_length=1, description="the compose service to freeze")

    def stack_refs(self) -> dict[str, str]:
        return {"service": self.service}


def _group_processes(pid: int, pgid: int | None) -> list[psutil.Process]:
    """The process ``pid`` and, when ``pgid`` is known, every process of that group."""
    procs: dict[int, psutil.Process] = {}
    try:
        procs[pid] = psutil.Process(pid)
    except psutil.NoSuchProcess:
        pass
    if pgid is not None:
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) == pgid:
                    procs[p.pid] = p
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
    return list(procs.values())


def frozen_state(stack: Any, service: str) -> dict[str, Any]:
    """How frozen ``service`` is now.

    Returns:
        ``{"state": <stack state>, "pids": n, "stopped": n, "frozen": bool}``: ``stopped`` counts
        the service's live processes psutil reports as ``stopped`` (SIGSTOP); ``frozen`` is True
        when every one is stopped. Under the compose backend ``docker pause`` freezes the
        container's cgroup, which psutil does not show as *stopped*; there the container state
        the engine reports (``paused``) is the proof.
    """
    st = stack.status().get(service)
    if st is None or st.pid is None:
        return {"state": st.state if st else "unknown", "pids": 0, "stopped": 0, "frozen": False}
    procs = _group_processes(st.pid, (st.detail or {}).get("pgid"))
    statuses = []
    for p in procs:
        try:
            s = p.status()
        except psutil.Error:
            continue
        if s != psutil.STATUS_ZOMBIE:
            statuses.append(s)
    stopped = sum(s in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP) for s in statuses)
    if getattr(stack, "backend", "local") != "local":
        frozen = st.state == "paused"
    else:
        frozen = stopped == len(statuses) > 0
    return {"state": st.state, "pids": len(statuses), "stopped": stopped, "frozen": frozen}


@register("pause")
class Pause(Fault):
    """Freeze the service at apply, thaw it at heal."""

    params_model = PauseParams
    params: PauseParams

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """A request of the workload was in flight while the service was frozen: its clients met
        the freeze (timeouts, not resets)."""
        return DefaultTrigger("requests_in_place", "a request of the workload was in flight while the "
                              "service was frozen, so its clients met the freeze")

    @classmethod
    def holds_lmcache_answers(cls, params: FaultParams) -> bool:
        """True for LMCache and its L2 services (a frozen server answers nothing; a frozen Redis
        holds LMCache's prefetch, so its lookups), False for an engine."""
        return not str(getattr(params, "service", "")).startswith("engine")

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._applied = False
        self._paused_at: float | None = None
        self._at_apply: dict[str, Any] | None = None
        self._at_heal: dict[str, Any] | None = None
        self._stopped_s: float | None = None
        self._contexts: int | None = None

    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """SIGSTOP the service and look at its processes.

        Raises:
            RuntimeError: no stack in the context; StackError: unknown or not-started service.
        """
        stack = require_stack(ctx)
        if self.params.service == stack.settings.lmcache:
            self._contexts = stack.lmcache_contexts()
        self._applied = True
        stack.pause(self.params.service)
        self._paused_at = time.monotonic()
        self._at_apply = _settled(stack, self.params.service)
        return {"service": self.params.service, **self._at_apply}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """SIGCONT the service (also when apply failed half-way); LMCache: then wait until the
        engine uses it again (chaos/stack/reconnect.py)."""
        if not self._applied or ctx.stack is None:
            return {"service": self.params.service, "resumed": False, "reason": "not applied here"}
        self._at_heal = frozen_state(ctx.stack, self.params.service)
        if self._paused_at is not None and self._at_heal["frozen"] and (self._at_apply or {}).get("frozen"):
            self._stopped_s = time.monotonic() - self._paused_at
        ctx.stack.resume(self.params.service)
        after = frozen_state(ctx.stack, self.params.service)
        out = {"service": self.params.service, "resumed": True, "state": after["state"],
               "still_stopped": after["stopped"]}
        if ctx.stack.engine_under_lmcache([self.params.service]):
            # The engine's client went to degraded mode while LMCache was frozen: the next phase
            # starts once it uses LMCache again.
            out["engine"] = ctx.stack.wait_engine_reconnected(self._contexts)
        return out

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when the processes were stopped both right after apply and right before heal."""
        bit = self._stopped_s is not None
        out: dict[str, Any] = {"bit": bit, "service": self.params.service, "stopped_s": self._stopped_s,
                               "at_apply": self._at_apply, "at_heal": self._at_heal}
        if not bit:
            out["reason"] = "the service's processes were not seen stopped for the whole fault"
        return out


def _settled(stack: Any, service: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """``frozen_state`` once the kernel has delivered SIGSTOP to the whole group (or timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = frozen_state(stack, service)
        if state["frozen"] or time.monotonic() >= deadline:
            return state
        time.sleep(0.02)
