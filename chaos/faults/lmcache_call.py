"""lmcache_call: one raw call of LMCache's own scheduler adapter, made by the engine.

    apply ── POST <engine_url>/hooks/lmcache {call, request_id, tokens}
                 the engine makes the call once, on its scheduler thread, outside any request,
                 exactly as a client would (none of the engine's own bookkeeping or
                 workarounds): chaos/engine/connector.py ``LMCacheConnector.raw_call``
    heal  ── nothing (what the call did on the server is what the scenario checks)

Calls (LMCache 0.5.6 ``LMCacheMPSchedulerAdapter``,
``lmcache/integration/vllm/vllm_multi_process_adapter.py``):

- ``free_lookup_locks``: FREE_LOOKUP_LOCKS of ``[0, tokens)`` for ``request_id``, a request the
  server never looked up (a client replaying lock frees after the server restarted);
- ``lookup_then_end_session``: LOOKUP, then ``end_session`` at once (a request aborted right
  after its lookup was sent).

The prompt is ``tokens`` token ids derived from ``request_id``, so it matches nothing a
workload stored. For the reproducers of docs/findings/, which need LMCache's own behaviour
without a request's timing around it.

Evidence: the engine answered the call (HTTP 200, the call named in its answer) and the adapter
was healthy when it was made (``adapter_healthy_before``: an unhealthy adapter drops a call
without a word, so that call did not act). An engine with no LMCache connection (HTTP 503)
did not bite; any other refusal fails apply.
"""

from __future__ import annotations

from typing import Any, Literal

import httpx
from pydantic import Field

from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams
from chaos.faults.kill import require_stack
from chaos.faults.registry import register

__all__ = ["LMCacheCallParams", "LMCacheCall"]


class LMCacheCallParams(FaultParams):
    """One raw call of LMCache's scheduler adapter, through the engine's hook."""

    kind: Literal["lmcache_call"]
    call: Literal["free_lookup_locks", "lookup_then_end_session"] = Field(
        description="free_lookup_locks (FREE_LOOKUP_LOCKS for a request the server never looked up) or "
        "lookup_then_end_session (LOOKUP, then end_session at once)")
    request_id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$",
                            description="the request id sent to LMCache (unique in the run)")
    tokens: int = Field(default=512, ge=1, le=65536,
                        description="prompt length in tokens, at least one chunk (256 on the reference stack)")


@register("lmcache_call")
class LMCacheCall(Fault):
    """Ask the engine to make one call of LMCache's adapter at apply."""

    params_model = LMCacheCallParams
    params: LMCacheCallParams
    needs = ("engine.hooks.lmcache",)

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """The engine made the call on a healthy LMCache adapter (the fault's evidence)."""
        return DefaultTrigger("evidence", "the engine made the call while its LMCache adapter was healthy "
                              "(the fault's evidence)")

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._status: int | None = None
        self._answer: Any = None

    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Make the call through ``POST {engine_url}/hooks/lmcache``.

        Raises:
            RuntimeError: no stack, or it has no ``engine_url``; or the engine refused the call
                with another status than 200 or 503 (e.g. 404: no such hook; 400: a prompt
                shorter than a chunk).
            httpx.HTTPError: the engine did not answer.
        """
        s = require_stack(ctx).settings
        if not s.engine_url:
            raise RuntimeError("lmcache_call needs the stack's engine_url (x-kvchaos.engine_url)")
        p = self.params
        r = httpx.post(f"{s.engine_url.rstrip('/')}/hooks/lmcache", timeout=60,
                       json={"call": p.call, "request_id": p.request_id, "tokens": p.tokens})
        self._status = r.status_code
        if r.status_code not in (200, 503):
            raise RuntimeError(f"lmcache_call: POST /hooks/lmcache answered HTTP {r.status_code}: {r.text[:300]}")
        try:
            self._answer = r.json()
        except ValueError:
            self._answer = r.text[:300]
        return {"status": r.status_code, "answer": self._answer}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Nothing to undo."""
        return {"restored": False}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when the call was answered and made while the adapter was healthy."""
        a = self._answer if isinstance(self._answer, dict) else {}
        answered = self._status == 200 and a.get("call") == self.params.call
        healthy = a.get("adapter_healthy_before") is True
        out: dict[str, Any] = {"bit": answered and healthy, "call": self.params.call, "status": self._status,
                               "answer": self._answer}
        if self._status is None:
            out["reason"] = "the call was never made"
        elif not answered:
            out["reason"] = f"the engine did not make the call (HTTP {self._status}: {str(self._answer)[:200]})"
        elif not healthy:
            out["reason"] = "the adapter was unhealthy when the call was made: it dropped it"
        return out
