"""One request's state inside the engine, and the events it sends back to the HTTP layer."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any


#: Where a request's work is, finer than its Phase (``/debug/requests/{id}`` shows it):
#: queued (not looked up yet) -> lookup (LMCache lookup in flight) -> load (retrieving LMCache
#: chunks after a positive lookup, a stall before the retrieve included) -> prefill (computing
#: the prompt) -> decode (after the first token) -> finished | aborted. A preempted request goes
#: back to queued.
STAGES = ("queued", "lookup", "load", "prefill", "decode", "finished", "aborted")


class Phase(str, enum.Enum):
    """Where a request is in its life (``/debug/state`` shows the value)."""

    WAITING = "waiting"          # queued; its LMCache lookup may be in flight
    RUNNING = "running"          # holds blocks; prefill segments, then decode steps
    FINISHED = "finished"        # output complete (length or stop)
    ABORTED = "aborted"          # client went away or engine error


@dataclass
class TokenEvent:
    """One generated token (``token_id``), or the final event (``final=True``).

    Attributes:
        token_id: the new token, None in the final event.
        logprob: natural-log probability of ``token_id``.
        top_logprobs: ``{token_id: logprob}`` of the top-k alternatives, when asked.
        final: the last event of the request.
        finish_reason: ``length`` | ``stop`` | ``abort`` (final only).
        error: message of a failed request (final only); ``error_code`` its HTTP status.
    """

    token_id: int | None = None
    logprob: float | None = None
    top_logprobs: dict[int, float] | None = None
    final: bool = False
    finish_reason: str | None = None
    error: str | None = None
    error_code: int = 500


@dataclass
class Request:
    """A completion request as the scheduler tracks it.

    Token accounting follows vLLM: ``num_computed`` positions of
    ``prompt + output`` have their KV in this request's blocks.
    """

    request_id: str
    prompt: list[int]
    max_tokens: int
    cache_salt: str | None = None
    logprobs: int | None = None
    ignore_eos: bool = False
    arrival: float = field(default_factory=time.monotonic)
    phase: Phase = Phase.WAITING
    output: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    # Prompt positions whose KV is canonical and shareable (full segments), for APC.
    num_registered_blocks: int = 0
    # LMCache bookkeeping for the current attempt (reset on preemption).
    lookup_status: str = "unset"         # unset|disabled|pending|hit|miss|timeout|error
    lookup_tokens: int = 0               # tokens LMCache reported for the prefix
    stored_upto: int = 0                 # prompt tokens already stored
    # Statistics reported in kv_transfer_params.cached_token_stats (first attempt wins
    # for local/external hits, as vLLM reports the first scheduling).
    local_hit_tokens: int = 0
    external_hit_tokens: int = 0
    load_failed_tokens: int = 0
    num_preemptions: int = 0
    stats_frozen: bool = False
    # Planted-bug state (stale-blocks-on-resume).
    stale_table: list[int] | None = None
    stale_computed: int = 0
    abort_requested: bool = False
    first_token_time: float | None = None
    stage: str = "queued"                 # one of STAGES; written by the scheduler thread only
    abort_arrived_in: str | None = None   # the stage when the abort reached the engine
    abort_handled_in: str | None = None   # the stage when the scheduler handled it
    sink: Any = None                      # callable(TokenEvent), set by the HTTP layer

    @property
    def all_tokens(self) -> list[int]:
        """Prompt followed by the output so far."""
        return self.prompt + self.output

    def debug(self) -> dict[str, Any]:
        """The per-request entry of ``/debug/state``."""
        return {
            "phase": self.phase.value,
            "stage": self.stage,
            "prompt_tokens": len(self.prompt),
            "output_tokens": len(self.output),
            "num_computed": self.num_computed,
            "blocks": len(self.block_table),
            "lookup": self.lookup_status,
            "lookup_tokens": self.lookup_tokens,
            "local_hit_tokens": self.local_hit_tokens,
            "external_hit_tokens": self.external_hit_tokens,
            "num_preemptions": self.num_preemptions,
        }
