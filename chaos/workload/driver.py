"""Run one phase's conversations against the engine with bounded concurrency.

Each in-flight request holds one of ``concurrency`` client slots; the slot is its history
process (``client-N``), so, as in Jepsen, a process has at most one request open at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from chaos.workload.client import Cancel, CompletionClient, CompletionOutcome, CompletionRequest
from chaos.workload.generator import Conversation, TurnPlan

__all__ = ["run_conversations", "CancelPicker"]

CancelPicker = Callable[[TurnPlan], "Cancel | None"]
"""Called as each request starts; returns a Cancel to abort it on purpose (the cancel fault)."""


async def run_conversations(
    client: CompletionClient,
    conversations: list[Conversation],
    *,
    phase: str,
    concurrency: int,
    deadline_s: float | None = None,
    cancel_for: CancelPicker | None = None,
    gate: asyncio.Event | None = None,
) -> dict[str, CompletionOutcome]:
    """Send every turn of every conversation; turns of a conversation go in order.

    Turn k's prompt = turn k-1's prompt + turn k-1's output token ids (whatever arrived, also
    when it was cut short) + turn k's user tokens.

    Args:
        client: records each request on its history.
        conversations: from chaos.workload.generator.plan_phase.
        phase: phase name for the history.
        concurrency: requests in flight at once (>= 1).
        deadline_s: per-request deadline, seconds (None: no deadline).
        cancel_for: see :data:`CancelPicker`.
        gate: while it is clear, no request is sent (those in flight go on); a request waits
            for it with its client slot taken, and records its ``invoke`` only once through
            (the runner holds requests while a ``hold_requests`` fault is being applied).

    Returns:
        request_id -> outcome, for every request sent.

    Raises:
        ValueError: concurrency < 1.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1 (got {concurrency})")
    slots: asyncio.Queue[int] = asyncio.Queue()
    for i in range(concurrency):
        slots.put_nowait(i)
    results: dict[str, CompletionOutcome] = {}

    async def one_conversation(conv: Conversation) -> None:
        prompt: list[int] = []
        for plan in conv.turns:
            prompt = prompt + plan.user_tokens
            req = CompletionRequest(
                request_id=plan.request_id,
                prompt_token_ids=prompt,
                max_tokens=plan.max_tokens,
                stream=plan.stream,
                cache_salt=plan.cache_salt,
                family=plan.family,
                tenant=plan.cache_salt,
                conversation=plan.conversation,
                turn=plan.turn,
                prefix_len=plan.prefix_len,
            )
            slot = await slots.get()
            try:
                if gate is not None:
                    await gate.wait()
                outcome = await client.complete(
                    req,
                    process=f"client-{slot}",
                    phase=phase,
                    deadline_s=deadline_s,
                    cancel=cancel_for(plan) if cancel_for is not None else None,
                )
            finally:
                slots.put_nowait(slot)
            results[plan.request_id] = outcome
            prompt = prompt + outcome.token_ids

    await asyncio.gather(*(one_conversation(c) for c in conversations))
    return results
