"""kill: a service's process dies (SIGKILL: a node crash or OOM kill; SIGTERM: an orderly stop).

    apply ── stack.kill(service, signal) ── wait until the stack sees it exited
                │
                └─ restart_after given: a timer starts the service again that long after the
                   kill and waits for its health check
    heal  ── the service is started again (if it is not running yet) and waited healthy;
             LMCache: then until the engine uses the new server again (chaos/stack/reconnect.py);
             raises when that restart, or the timer's, failed (the runner: an infrastructure
             error, since the stack was not the scenario's for a while); except when a restart
             started the service and it then exited on its own before it became healthy, no
             other process holding its ports (StackError.exited), in a scenario with a liveness
             check: that is the service failing to come back under the scenario's faults (a
             crash at start-up), recorded as an exit no fault caused, which liveness fails on;
             heal then starts it again (up to HEAL_STARTS times, each crash recorded the same
             way), so the scenario goes on with the stack whole

The stack records the exit as expected (``stack.exits``, ``expected=True``), so the liveness
check does not count it as an unexplained death. Field reports: F5 (the engine's worker died),
F11 (the remote cache server restarted and clients never reconnected).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Literal

from pydantic import Field

from chaos.duration import PositiveDuration
from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams
from chaos.faults.registry import register

__all__ = ["KillParams", "Kill", "wait_exited", "require_stack"]

#: How long apply waits for the stack to report the service exited after SIGKILL (s). After
#: SIGTERM it waits the service's ``stop_grace_period`` (compose: how long a graceful stop may
#: take), at least 1 s.
EXIT_WAIT_S = 10.0
#: How many times heal starts a service whose start-ups crash on their own (StackError.exited)
#: before it gives up (an infrastructure error then: the stack cannot be made whole).
HEAL_STARTS = 3


class KillParams(FaultParams):
    """Signal a service's processes; start it again after ``restart_after`` or at heal."""

    kind: Literal["kill"]
    service: str = Field(min_length=1, description="the compose service whose processes are signalled")
    signal: Literal["SIGKILL", "SIGTERM"] = Field(
        default="SIGKILL", description="SIGKILL (default: a crash, no cleanup) or SIGTERM (a graceful stop)"
    )
    restart_after: PositiveDuration | None = Field(
        default=None,
        description="start the service again this long after the kill and wait until it is healthy; "
        "when omitted, heal starts it again",
    )

    def stack_refs(self) -> dict[str, str]:
        return {"service": self.service}


def wait_exited(stack: Any, service: str, timeout_s: float) -> tuple[bool, int | None]:
    """Poll ``stack.status()`` until ``service`` is in state ``exited``.

    Returns:
        (exited, returncode); returncode is None when unknown.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        st = stack.status().get(service)
        if st is not None and st.state == "exited":
            return True, st.returncode
        if time.monotonic() >= deadline:
            return False, None
        time.sleep(0.05)


@register("kill")
class Kill(Fault):
    """Signal the service; start it again after ``restart_after`` or at heal."""

    params_model = KillParams
    params: KillParams

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """A request of the workload was in flight when the service went down, or was sent after
        (in this phase or a later one): the service's clients met the outage or the restarted
        service (a kill nobody's request met afterwards tested nothing)."""
        return DefaultTrigger("requests_from_apply", "a request of the workload was in flight when the "
                              "service went down or was sent after it, so the service's clients met the "
                              "outage or the restarted service")

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._lock = threading.Lock()
        self._applied = False
        self._killed_at: float | None = None
        self._exited = False
        self._returncode: int | None = None
        self._old_pid: int | None = None
        self._new_pid: int | None = None
        self._restarted_at: float | None = None
        self._restart_error: str | None = None
        # Restarts that started the service, which then exited on its own before it was
        # healthy (StackError.exited): the service's failures, not the infrastructure's.
        self._crashes: list[str] = []
        self._restarted_by: str | None = None
        self._timer: threading.Timer | None = None
        self._exits_before = 0
        self._contexts: int | None = None

    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Send the signal and wait until the stack reports the exit (SIGKILL: up to 10 s;
        SIGTERM: up to the service's ``stop_grace_period``).

        Raises:
            RuntimeError: no stack in the context; StackError: unknown or not-started service.
        """
        stack = require_stack(ctx)
        p = self.params
        before = stack.status().get(p.service)
        self._old_pid = before.pid if before is not None else None
        if p.service == stack.settings.lmcache:
            self._contexts = stack.lmcache_contexts()  # what the engine must re-register (heal)
        self._exits_before = len(stack.exits)
        self._applied = True
        self._killed_at = time.monotonic()
        stack.kill(p.service, p.signal)
        wait_s = EXIT_WAIT_S
        if p.signal == "SIGTERM":
            svc = stack.spec.services.get(p.service)
            wait_s = max(1.0, svc.stop_grace_period if svc is not None else EXIT_WAIT_S)
        self._exited, self._returncode = wait_exited(stack, p.service, wait_s)
        if self._exited:
            # Settle the stack's books for the dead process: end what is left of its process
            # group (children that outlive the leader) and close its journal entry. LocalStack
            # only does this itself when the group is gone by the time kill() returns.
            stack.stop(p.service)
        if p.restart_after is not None:
            delay = max(0.0, p.restart_after - (time.monotonic() - self._killed_at))
            self._timer = threading.Timer(delay, self._restart, args=(stack, "timer"))
            self._timer.daemon = True
            self._timer.start()
        return {"service": p.service, "signal": p.signal, "pid": self._old_pid, "exited": self._exited,
                "returncode": self._returncode, "restart_after_s": p.restart_after}

    def _restart(self, stack: Any, by: str) -> None:
        with self._lock:
            if self._restarted_at is not None:
                return
            try:
                st = stack.status().get(self.params.service)
                if st is None or st.state != "running":
                    stack.start(self.params.service, wait=True)
                    self._restarted_by = by
            except Exception as exc:  # reported by heal (timer) or raised (heal)
                if getattr(exc, "exited", False):
                    stack.status()  # the stack records the crashed process's exit (unexpected)
                    self._crashes.append(f"{by}: {type(exc).__name__}: {exc}")
                else:
                    self._restart_error = f"{type(exc).__name__}: {exc}"
                if by == "heal":
                    raise
            finally:
                self._restarted_at = time.monotonic()
            now = stack.status().get(self.params.service)
            self._new_pid = now.pid if now is not None else None

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Start the service again (if the timer has not) and wait for its health check.

        Raises:
            StackError: the service did not come back healthy (e.g. another process took its
                port, named with its pid); RuntimeError: the timer's restart (``restart_after``)
                had failed, even when heal's own restart then worked: between the two the stack
                ran without the service, which the scenario does not describe (and the failed
                process's exit would read as an unexplained death). Not raised when a restarted
                process exited on its own (StackError.exited, no lost bind) and the scenario
                has a liveness check (``ctx.judges_service_exits``): that exit is the
                service's, recorded as unexpected (``crashed_at_restart`` in the result; the
                liveness check names it), and heal starts it again, up to ``HEAL_STARTS``
                start-ups; the last one failing raises as above.
        """
        if not self._applied or ctx.stack is None:
            return {"service": self.params.service, "restarted": False, "reason": "not applied here"}
        timer = self._timer
        if timer is not None:
            timer.cancel()  # not fired yet: heal restarts now; fired: join waits for it
            timer.join()
        if (self._restart_error is not None or self._crashes) and self._restarted_by is None:
            # The timer's restart failed; try once more now, so heal leaves the stack whole.
            self._restarted_at = None
        for attempt in range(1, HEAL_STARTS + 1):
            try:
                self._restart(ctx.stack, "heal")
                break
            except Exception as exc:
                # A crash at start-up is the service's (recorded, judged by liveness): start it
                # again, a few times, so the scenario goes on with the stack whole.
                if not (getattr(exc, "exited", False) and ctx.judges_service_exits and attempt < HEAL_STARTS):
                    raise
                self._restarted_at = None
        down_s = (self._restarted_at - self._killed_at) if self._killed_at and self._restarted_at else None
        out = {"service": self.params.service, "restarted": self._restarted_by is not None,
               "restarted_by": self._restarted_by,
               "pid": self._new_pid, "down_s": down_s, "timer_error": self._restart_error,
               "crashed_at_restart": "; ".join(self._crashes) or None}
        if ctx.stack.engine_under_lmcache([self.params.service]):
            # The next phase starts once the engine uses the new LMCache server again.
            out["engine"] = ctx.stack.wait_engine_reconnected(self._contexts)
        if self._restart_error is not None:
            raise RuntimeError(f"the restart of service {self.params.service!r} {self.params.restart_after:g}s after "
                               f"the kill failed ({self._restart_error}); it was started again at heal")
        if self._crashes and not ctx.judges_service_exits:
            raise RuntimeError(f"the restart of service {self.params.service!r} {self.params.restart_after:g}s after "
                               f"the kill failed ({self._crashes[0]}); it was started again at heal, and no "
                               "check of the scenario judges a service exit (add liveness)")
        return out

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when the stack saw the service's process exit after the kill, recorded as an
        exit kvchaos caused (``stack.exits[...].expected``)."""
        p = self.params
        exits = []
        if ctx.stack is not None:
            exits = [e for e in ctx.stack.exits[self._exits_before:] if e.service == p.service]
        expected = any(e.expected for e in exits)
        bit = bool(self._exited and expected)
        out: dict[str, Any] = {"bit": bit, "service": p.service, "signal": p.signal, "exited": self._exited,
                               "returncode": self._returncode, "exit_recorded_as_expected": expected,
                               "old_pid": self._old_pid, "new_pid": self._new_pid}
        if not bit:
            out["reason"] = ("the process did not exit (it may handle SIGTERM without exiting)"
                             if not self._exited else "the stack recorded no expected exit")
        return out


def require_stack(ctx: FaultContext) -> Any:
    """The context's running stack.

    Raises:
        RuntimeError: the context has none (e.g. ``kvchaos cleanup`` healing without a stack).
    """
    if ctx.stack is None:
        raise RuntimeError("process faults need the running stack (FaultContext.stack is None)")
    return ctx.stack
