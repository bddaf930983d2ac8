"""preempt: the engine preempts running requests (recompute-style), as when KV blocks run out.

    via: hook ── apply: POST {engine_url}/hooks/preempt {"request_id": "newest"|"all"} at once,
                 then every ``interval`` from a background thread; heal: the thread stops
    via: pool ── nothing is called: the stack's own knobs force preemption (a KV pool too small
                 for the workload's concurrency, e.g. the scenario's ``ENGINE_NUM_BLOCKS``
                 variable, which vLLM's stack file passes as ``--num-gpu-blocks-override``);
                 the fault is the window in which preemptions must happen

The hook is the reference engine's fault route (docs/architecture.md section 2: ``POST
/hooks/preempt`` -> ``{"preempted": [ids]}``). The pool form is how LMCache's own preemption
correctness test forces preemption on vLLM (``--num-gpu-blocks-override N`` with
``concurrency * (prompt + max_tokens) >> N * block_size``, asserted from vLLM's
``/metrics`` counter; LMCache ``.buildkite/k3_tests/multiprocess/scripts/
preemption_correctness.py``). A preempted request loses its blocks and is scheduled again;
when it resumes, more tokens may be computed than the cache hit covered (field report F10:
negative tokens-to-load, an assertion, the engine died).

Evidence: the delta of the engine's preemption counter between apply and heal
(``x-kvchaos.engine_metrics.preemptions``, default vLLM's ``vllm:num_preemptions_total``,
which the reference engine exports too).
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
from chaos.prometheus import scrape_counters

__all__ = ["PreemptParams", "Preempt", "PREEMPTIONS"]

PREEMPTIONS = "vllm:num_preemptions_total"


class PreemptParams(FaultParams):
    """Preempt running requests: through the engine's hook, or by the stack's small KV pool."""

    kind: Literal["preempt"]
    via: Literal["hook", "pool"] = Field(
        default="hook",
        description="hook: call the engine's POST /hooks/preempt (reference engine); pool: call "
        "nothing, the scenario's small KV pool (e.g. variables: {ENGINE_NUM_BLOCKS: ...}) and its "
        "concurrency make the engine preempt on its own; either way the preemption counter must grow",
    )
    target: Literal["newest", "all"] = Field(
        default="newest", description="which running requests each call preempts: the newest one, or all "
        "(via: hook)"
    )
    interval: PositiveDuration = Field(
        default=1.0, description="time between preempt calls while the fault is active, first call at apply "
        "(via: hook)"
    )


@register("preempt")
class Preempt(Fault):
    """Preempt through the engine's hook (``via: hook``) or watch the stack's small KV pool
    preempt (``via: pool``); evidence is the engine's preemption counter either way."""

    params_model = PreemptParams
    params: PreemptParams
    needs = ("engine.metrics",)

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """The engine counted a preemption while the fault was in place (its /metrics counter:
        the fault's evidence; vLLM and the reference engine both count it)."""
        return DefaultTrigger("evidence", "the engine counted a preemption while the fault was in place "
                              "(the fault's evidence)")

    @classmethod
    def capability_needs(cls, params: FaultParams) -> set[str]:
        """``engine.metrics`` (the counter), plus ``engine.hooks.preempt`` for ``via: hook``."""
        assert isinstance(params, PreemptParams)
        return set(cls.needs) | ({"engine.hooks.preempt"} if params.via == "hook" else set())

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
        self._metric = PREEMPTIONS

    def _count(self) -> float | None:
        assert self._metrics_url is not None
        try:
            return scrape_counters(self._metrics_url, [self._metric])[self._metric]
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
        """Read the preemption counter and, ``via: hook``, start calling the hook.

        Raises:
            RuntimeError: no stack, or the stack has no ``x-kvchaos.engine_url``.
            httpx.HTTPError: the engine's ``/metrics`` did not answer (the engine is down).
        """
        stack = require_stack(ctx)
        base = stack.settings.engine_url
        if not base:
            raise RuntimeError("preempt needs the engine's address: set x-kvchaos.engine_url in the stack file")
        base = base.rstrip("/")
        self._metric = stack.settings.engine_metrics.preemptions
        self._url, self._metrics_url = f"{base}/hooks/preempt", f"{base}/metrics"
        self._before = scrape_counters(self._metrics_url, [self._metric])[self._metric] or 0.0
        if self.params.via == "pool":
            return {"via": "pool", "metric": self._metric, "preemptions_before": self._before}
        self._thread = threading.Thread(target=self._loop, name=f"preempt-{self.id}", daemon=True)
        self._thread.start()
        return {"via": "hook", "hook": self._url, "target": self.params.target,
                "interval_s": self.params.interval}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Stop calling the hook and read the counter again."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._metrics_url is not None:
            self._after = self._count()
        return {"calls": self._calls, "preempted": len(self._preempted), "errors": self._errors[-5:]}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when the engine's preemption counter grew while the fault was active."""
        if self._before is None or self._after is None:
            return {"bit": False, "preemptions": None, "calls": self._calls,
                    "reason": self._metrics_error or "the engine's preemption counter was not read"}
        delta = self._after - self._before
        out: dict[str, Any] = {"bit": delta > 0, "preemptions": delta, "metric": self._metric,
                               "via": self.params.via}
        if self.params.via == "hook":
            out.update(calls=self._calls, preempted_ids=self._preempted[:50], errors=len(self._errors))
        if delta <= 0:
            if self.params.via == "pool":
                out["reason"] = ("the engine never preempted: its KV pool was not too small for the "
                                 "workload (lower the block count, raise concurrency or max_tokens)")
            else:
                out["reason"] = ("no request was running when the hook was called" if self._calls
                                 else "the hook was never called")
        return out
