"""The run's own baseline: the recompute twin timed on the prompts of requests that went past
their deadline or SLO bound, a fault in place or not (chaos/checks/host_load.py reads it).

    slow requests (liveness, slo) ──> their prompts + peers of their phases, up to the
    workload's concurrency ──> the recompute twin, `concurrency` at a time, each bounded ──>
    snapshots.twin_baseline {request id -> latency, ttft}

Asked only when some request was slow, right after the quiesce (seconds after the phases), so
the host is the one the requests met; after the quiesce, not before it, so the twin's requests
never delay the leak readings (a short lock TTL could free meanwhile what the run left held). The twin (no connector, no prefix cache) computes every token, so its time is what
the host gives an uncached request now. Each slow request is sent with the same max_tokens and
stream flag, beside peers of its phase that fill the concurrency, so the twin batches as many
requests as the engine did. These are fresh requests timed by this module: the recompute
oracle's answers come from a store kept across runs and time nothing.

Bounds: at most ``2 * concurrency`` slow requests are timed (the slowest first; the rest are
judged on their phase's peers), and a twin request is given up after the slowest of them took
(plus 1 s): a twin that has not answered by then was as slow, which is all the rule asks.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Sequence

from chaos.checks.requests import RequestRecord
from chaos.checks.snapshots import TwinBaseline, TwinTiming
from chaos.workload.client import CompletionClient, CompletionRequest

#: Slow requests timed per run, in units of the workload's concurrency.
MAX_WAVES = 2


def _plan(slow: Sequence[RequestRecord], everyone: Sequence[RequestRecord], concurrency: int) -> list[RequestRecord]:
    """The slow requests to time (slowest first, at most MAX_WAVES * concurrency) and peers of
    their phases (distinct prompts, completed) to fill the last wave up to ``concurrency``."""
    chosen = sorted((r for r in slow if r.prompt_token_ids), key=lambda r: -(r.latency_s or 0.0))
    chosen = chosen[:MAX_WAVES * concurrency]
    prompts = {tuple(r.prompt_token_ids or ()) for r in chosen}
    phases = {r.phase for r in chosen}
    fill = (-len(chosen)) % concurrency
    for r in everyone:
        if fill <= 0:
            break
        key = tuple(r.prompt_token_ids or ())
        if r.phase in phases and r.outcome is not None and key and key not in prompts:
            prompts.add(key)
            chosen.append(r)
            fill -= 1
    return chosen


def measure_twin(recompute_url: str | None, slow: Sequence[RequestRecord], everyone: Sequence[RequestRecord],
                 *, concurrency: int, run_async) -> TwinBaseline:
    """Time the recompute twin on ``slow`` requests' prompts (module doc).

    Args:
        recompute_url: the stack's recompute twin (None: it has none; the baseline says so).
        slow: the requests the checks want judged (completed; a fault in place or not).
        everyone: every request of the run (peers to fill the concurrency).
        concurrency: the workload's concurrency (>= 1).
        run_async: how to run a coroutine to its end (chaos.interrupts.run_async, so a signal
            cancels the requests in flight).
    Returns:
        the measurement; ``error`` set when there is none. Never raises for the twin's errors
        (they are recorded per request).
    """
    ids = [r.request_id for r in slow]
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    if not recompute_url:
        return TwinBaseline(concurrency=concurrency, slow=ids, load_average=load,
                            error="the stack has no recompute twin (x-kvchaos recompute_url)")
    plan = _plan(slow, everyone, max(1, concurrency))
    wait_s = max((r.latency_s or 0.0) for r in slow) + 1.0 if slow else 1.0
    timings: dict[str, TwinTiming] = {}
    t0 = time.monotonic()

    async def ask() -> None:
        sem = asyncio.Semaphore(max(1, concurrency))
        async with CompletionClient(recompute_url, history=None) as client:
            async def one(r: RequestRecord) -> None:
                req = CompletionRequest(request_id=f"kvchaos-baseline-{r.request_id}",
                                        prompt_token_ids=list(r.prompt_token_ids or []),
                                        max_tokens=int(r.invoke_value.get("max_tokens") or 1),
                                        stream=bool(r.invoke_value.get("stream")))
                async with sem:
                    out = await client.complete(req, deadline_s=wait_s)
                timings[r.request_id] = TwinTiming(
                    outcome=out.type, latency_s=out.latency_s if out.type == "ok" else None,
                    ttft_s=out.ttft_s if out.type == "ok" else None, waited_s=wait_s,
                    error=out.error if out.type != "ok" else None)
            await asyncio.gather(*(one(r) for r in plan))

    run_async(ask())
    return TwinBaseline(concurrency=concurrency, timings=timings, slow=ids, load_average=load,
                        took_s=time.monotonic() - t0)
