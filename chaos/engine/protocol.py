"""HTTP request and error bodies (vLLM's OpenAI-compatible subset; docs/architecture.md §2).

Field names follow vLLM's ``vllm/entrypoints/openai/protocol.py`` (``CompletionRequest``,
``ErrorResponse``). Unknown fields are rejected with HTTP 400 (vLLM only warns) so that a
scenario's typo cannot silently change what it tests.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class CompletionRequest(BaseModel):
    """``POST /v1/completions`` body."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | list[int] = Field(..., description="text (UTF-8 bytes) or token ids")
    max_tokens: int = Field(16, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    seed: int | None = None
    user: str | None = None
    ignore_eos: bool = False
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None  # vLLM's; tokens are always spelled token_id:N

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, v: str | list[int]) -> str | list[int]:
        if len(v) == 0:
            raise ValueError("prompt must not be empty")
        return v

    @field_validator("temperature")
    @classmethod
    def _greedy_only(cls, v: float | None) -> float | None:
        if v not in (None, 0, 0.0):
            raise ValueError("the reference engine decodes greedily: temperature must be 0")
        return v

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("n must be 1")
        return v


class PreemptHook(BaseModel):
    """``POST /hooks/preempt`` body: a request id, ``newest`` or ``all``."""

    model_config = ConfigDict(extra="forbid")
    request_id: str = "newest"


class BugsSwitch(BaseModel):
    """``PUT /debug/bugs`` body: the planted bugs from now on (names of ``chaos/engine/bugs.py``;
    empty: none). Tests only: one running engine stands for an engine started with those
    ``--bug`` flags, instead of one engine start per planted bug."""

    model_config = ConfigDict(extra="forbid")
    bugs: list[str]


class StallHook(BaseModel):
    """``POST /hooks/stall`` body: hold the scheduler ``seconds`` at ``point``, ``count`` times.

    Points: ``before_lookup``, ``before_retrieve``, ``before_store``. Opens timing windows
    for faults (e.g. kill the LMCache server between lookup and retrieve). Replaces what is
    still pending at ``point``; ``seconds`` 0 clears it (nothing is held).
    """

    model_config = ConfigDict(extra="forbid")
    point: str
    seconds: float = Field(..., ge=0, le=120)
    count: int = Field(1, ge=1, le=1000)


class LMCacheCallHook(BaseModel):
    """``POST /hooks/lmcache`` body: one call of LMCache's own scheduler adapter, made once on
    the scheduler thread, outside any request of the engine (docs/findings/ reproducers).

    Calls (``lmcache.integration.vllm.vllm_multi_process_adapter.LMCacheMPSchedulerAdapter``):

    - ``free_lookup_locks``: FREE_LOOKUP_LOCKS of ``[0, tokens)`` for ``request_id``, a request
      the server never looked up (``free_lookup_locks(token_ids, 0, tokens, request_id)``).
    - ``lookup_then_end_session``: ``maybe_submit_lookup_request`` then, at once,
      ``end_session`` (what a client does for a request aborted right after its lookup).

    The prompt is ``tokens`` token ids derived from ``request_id`` (the same ids for the same
    request id), so it matches nothing the workload stored.
    """

    model_config = ConfigDict(extra="forbid")
    call: str = Field(..., description="free_lookup_locks | lookup_then_end_session")
    request_id: str = Field(..., min_length=1, max_length=200)
    tokens: int = Field(512, ge=1, le=65536, description="prompt length in tokens")


def error_body(message: str, code: int = 400, err_type: str = "BadRequestError",
               param: str | None = None) -> dict[str, Any]:
    """vLLM's ``ErrorResponse`` as JSON.

    Args:
        message: what was wrong and what to do.
        code: HTTP status.
        err_type: ``BadRequestError`` | ``InternalServerError`` | ``NotFoundError``.
        param: the offending field, if any.

    Returns:
        ``{"object": "error", "message", "type", "param", "code"}``.
    """
    return {"object": "error", "message": message, "type": err_type, "param": param,
            "code": code}
