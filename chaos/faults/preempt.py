"""preempt: the engine preempts running requests (recompute-style), as when KV blocks run out.

    apply ── POST {engine_url}/hooks/preempt {"request_id": "newest"|"all"} at once, then every
             ``interval`` from a background thread
    heal  ── the thread stops

The route is the reference engine's fault hook (docs/architecture.md section 2: ``POST
/hooks/preempt`` -> ``{"preempted": [ids]}``). A preempted request loses its blocks and is
scheduled again; when it resumes, more tokens may be computed than the cache hit covered (field
report F10: negative tokens-to-load, an assertion, the engine died).

Evidence: the delta of ``vllm:num_preemptions_total`` (vLLM's counter name, exported by the
reference engine's ``/metrics``) between apply and heal.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Literal

import httpx
from pydantic import Field

from chaos.faults.base import Fault, FaultContext, FaultParams
from chaos.prometheus import scrape_counters
from chaos.faults.kill import require_stack
from chaos.faults.registry import register
from chaos.scenario.duration import PositiveDuration

__all__ = ["PreemptParams", "Preempt", "PREEMPTIONS"]

PREEMPTIONS = "vllm:num_preemptions_total"


class PreemptParams(FaultParams):
    """Call the engine's preempt hook at apply and every ``interval`` until heal."""

    kind: Literal["preempt"]
    target: Literal["newest", "all"] = Field(
        default="newest", description="which running requests each call preempts: the newest one, or all"
    )
    interval: PositiveDuration = Field(
        default=1.0, description="time between preempt calls while the fault is active (first call at apply)"
    )


@register("preempt")
class Preempt(Fault):
    """Call the engine's preempt hook at apply and every ``interval`` until heal."""

    params_model = PreemptParams
    params: PreemptParams

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._url: str | None = None
        self._metrics_url: str | None = None
        self._calls = 0
        self._preempted: list[str] = []
        self._errors: list[str] = []
        self._before: float | None = None
        self._after: float | None = None
        self._metrics_error: str | None = None

    def _count(self) -> float | None:
        assert self._metrics_url is not None
        try:
            return scrape_counters(self._metrics_url, [PREEMPTIONS])[PREEMPTIONS]
        except (httpx.HTTPError, ValueError) as exc:
            self._metrics_error = f"{type(exc).__name__}: {exc}"
            return None

    def _call(self, http: httpx.Client) -> None:
        assert self._url is not None
        try:
            r = http.post(self._url, json={"request_id": self.params.target})
            r.raise_for_status()
            self._preempted.extend(str(i) for i in (r.json().get("preempted") or []))
        except (httpx.HTTPError, ValueError) as exc:
            self._errors.append(f"{type(exc).__name__}: {exc}")
        self._calls += 1

    def _loop(self) -> None:
        with httpx.Client(timeout=10) as http:
            next_t = time.monotonic()
            while True:
                self._call(http)
                next_t += self.params.interval
                if self._stop.wait(max(0.0, next_t - time.monotonic())):
                    return

    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Read the preemption counter and start calling the hook.

        Raises:
            RuntimeError: no stack, or the stack has no ``x-kvchaos.engine_url``.
            httpx.HTTPError: the engine's ``/metrics`` did not answer (the engine is down).
        """
        stack = require_stack(ctx)
        base = stack.settings.engine_url
        if not base:
            raise RuntimeError("preempt needs the engine's address: set x-kvchaos.engine_url in the stack file")
        base = base.rstrip("/")
        self._url, self._metrics_url = f"{base}/hooks/preempt", f"{base}/metrics"
        self._before = scrape_counters(self._metrics_url, [PREEMPTIONS])[PREEMPTIONS] or 0.0
        self._thread = threading.Thread(target=self._loop, name=f"preempt-{self.id}", daemon=True)
        self._thread.start()
        return {"hook": self._url, "target": self.params.target, "interval_s": self.params.interval}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Stop calling the hook and read the counter again."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._metrics_url is not None:
            self._after = self._count()
        return {"calls": self._calls, "preempted": len(self._preempted), "errors": self._errors[-5:]}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when the engine's ``vllm:num_preemptions_total`` grew while the fault was active."""
        if self._before is None or self._after is None:
            return {"bit": False, "preemptions": None, "calls": self._calls,
                    "reason": self._metrics_error or "the engine's preemption counter was not read"}
        delta = self._after - self._before
        out: dict[str, Any] = {"bit": delta > 0, "preemptions": delta, "calls": self._calls,
                               "preempted_ids": self._preempted[:50], "errors": len(self._errors)}
        if delta <= 0:
            out["reason"] = ("no request was running when the hook was called" if self._calls
                             else "the hook was never called")
        return out
