from __future__ import annotations

import asyncio

import pytest

from chaos.history import HistoryWriter, load_history
from chaos.workload.classify import classify
from chaos.workload.client import Cancel, CompletionClient, CompletionRequest
from chaos.workload.driver import run_conversations
from chaos.workload.generator import plan_phase, prompt_hash
from chaos.workload.spec import WorkloadSpec

from .engine_double import EngineDouble, output_for

PROMPT = [72, 101, 108, 108, 111] * 10


def run(coro_fn, tmp_path):
    """Start the engine double, run coro_fn(engine, client, history), stop everything."""

    async def main():
        engine = EngineDouble()
        await engine.start()
        history = HistoryWriter(tmp_path / "history.jsonl")
        try:
            async with CompletionClient(engine.url, history=history) as client:
                return await coro_fn(engine, client, history)
        finally:
            history.close()
            await engine.stop()

    return asyncio.run(main())


def _req(rid: str, stream: bool, **kw) -> CompletionRequest:
    return CompletionRequest(request_id=rid, prompt_token_ids=PROMPT, max_tokens=6, stream=stream,
                             cache_salt="tenant-1", family=2, tenant="tenant-1", turn=0, **kw)


@pytest.mark.parametrize("stream", [False, True])
def test_ok_request_is_recorded(tmp_path, stream):
    async def body(engine, client, history):
        engine.stats.update(external_cache_hit_tokens=49, lookup="hit")
        return await client.complete(_req("warm-0-0", stream), process="client-3", phase="warm")

    out = run(body, tmp_path)
    assert out.type == "ok" and out.token_ids == output_for(PROMPT, 6)
    assert out.finish_reason == "length" and out.usage["completion_tokens"] == 6
    assert out.cached_token_stats["external_cache_hit_tokens"] == 49
    ops = load_history(tmp_path / "history.jsonl")
    assert [(o.type, o.f, o.process, o.phase, o.request_id) for o in ops] == [
        ("invoke", "complete", "client-3", "warm", "warm-0-0"),
        ("ok", "complete", "client-3", "warm", "warm-0-0")]
    inv = ops[0].value
    assert inv["prompt_token_ids"] == PROMPT and inv["prompt_len"] == 50
    assert inv["prompt_hash"] == prompt_hash(PROMPT) and inv["family"] == 2 and inv["cache_salt"] == "tenant-1"
    assert ops[1].value["token_ids"] == output_for(PROMPT, 6) and ops[1].value["prompt_len"] == 50
    assert ops[0].time <= ops[1].time
    assert classify(ops[1]) == "lmcache_hit_full"
    if stream:
        assert out.ttft_s is not None and out.ttft_s > 0 and len(out.itl_s) == 5
    else:
        assert out.ttft_s is None and out.itl_s == []


def test_request_id_header_and_body(tmp_path):
    async def body(engine, client, history):
        await client.complete(_req("p-1-0", False))
        return engine.requests

    (req,) = run(body, tmp_path)
    assert req["request_id"] == "p-1-0" and req["prompt"] == PROMPT and req["max_tokens"] == 6
    assert req["cache_salt"] == "tenant-1" and req["temperature"] == 0 and req["stream"] is False


@pytest.mark.parametrize("suffix, status", [("e400", 400), ("e500", 500)])
def test_http_errors_are_fail(tmp_path, suffix, status):
    async def body(engine, client, history):
        return await client.complete(_req(f"p-0-{suffix}", False))

    out = run(body, tmp_path)
    assert out.type == "fail" and out.status == status and out.error.startswith(f"HTTP {status}: ")
    assert classify(load_history(tmp_path / "history.jsonl")[1]) == "failed"


def test_error_event_in_stream_is_fail(tmp_path):
    async def body(engine, client, history):
        return await client.complete(_req("p-0-errevent", True))

    out = run(body, tmp_path)
    assert out.type == "fail" and "boom" in out.error and len(out.token_ids) == 1


def test_stream_cut_is_info(tmp_path):
    async def body(engine, client, history):
        return await client.complete(_req("p-0-cut", True))

    out = run(body, tmp_path)
    assert out.type == "info" and not out.aborted and len(out.token_ids) == 2


def test_deadline_is_info(tmp_path):
    async def body(engine, client, history):
        return await client.complete(_req("p-0-hang", False), deadline_s=0.2)

    out = run(body, tmp_path)
    assert out.type == "info" and out.error == "deadline exceeded" and 0.19 < out.latency_s < 2


def test_connect_refused_is_fail(tmp_path):
    async def main():
        async with CompletionClient("http://127.0.0.1:9", history=HistoryWriter()) as client:
            return await client.complete(_req("p-0-0", False)), client.history.ops

    out, ops = asyncio.run(main())
    assert out.type == "fail" and out.error.startswith("connect") and ops[-1].type == "fail"


def test_cancel_after_first_token(tmp_path):
    async def body(engine, client, history):
        out = await client.complete(_req("p-0-slow", True), cancel=Cancel(after_first_token=True))
        await asyncio.sleep(0.3)  # let the engine notice the closed connection
        return out, engine.disconnected

    out, disconnected = run(body, tmp_path)
    assert out.type == "info" and out.aborted and len(out.token_ids) == 1 and out.ttft_s is not None
    assert disconnected == ["p-0-slow"]
    op = load_history(tmp_path / "history.jsonl")[1]
    assert op.type == "info" and op.value["aborted"] is True and classify(op) == "aborted"


def test_cancel_after_ms(tmp_path):
    async def body(engine, client, history):
        out = await client.complete(_req("p-0-slow", True), cancel=Cancel(after_ms=120), deadline_s=10)
        await asyncio.sleep(0.3)
        return out, engine.disconnected

    out, disconnected = run(body, tmp_path)
    assert out.type == "info" and out.aborted and "120 ms" in out.error
    assert 1 <= len(out.token_ids) < 6 and disconnected == ["p-0-slow"]


def test_cancel_at_state_on_an_engine_without_request_states(tmp_path):
    """An engine with no stage watch (vLLM's surface): the request is sent, not aborted, and the
    outcome says why (the cancel fault's evidence then reads "never reached": inconclusive)."""
    async def body(engine, client, history):
        return await client.complete(_req("p-0", True), cancel=Cancel(at_state="load"), deadline_s=10)

    out = run(body, tmp_path)
    assert out.type == "ok" and not out.aborted and out.token_ids == output_for(PROMPT, 6)
    assert out.cancel["reached"] is False and "offers no stage watch" in out.cancel["reason"]
    op = load_history(tmp_path / "history.jsonl")[1]
    assert op.value["cancel"]["at_state"] == "load"


def test_runner_cancellation_records_info_and_propagates(tmp_path):
    async def body(engine, client, history):
        task = asyncio.create_task(client.complete(_req("p-0-hang", False)))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return history.ops

    ops = run(body, tmp_path)
    assert [o.type for o in ops] == ["invoke", "info"] and ops[1].value["aborted"] is True


def test_conversations_grow_and_respect_concurrency(tmp_path):
    spec = WorkloadSpec(families=2, prefix_tokens=[8, 12], suffix_tokens=3, turns=3, tenants=2,
                        requests=8, concurrency=2, max_tokens=4, stream=0.5)
    conversations = plan_phase(spec, seed=5, phase="p")

    async def body(engine, client, history):
        results = await run_conversations(client, conversations, phase="p", concurrency=2)
        return results, engine

    results, engine = run(body, tmp_path)
    assert len(results) == 8 and all(o.type == "ok" for o in results.values())
    assert engine.max_in_flight <= 2
    sent = {r["request_id"]: r for r in engine.requests}
    for conv in conversations:
        prompt: list[int] = []
        for plan in conv.turns:
            prompt = prompt + plan.user_tokens
            assert sent[plan.request_id]["prompt"] == prompt
            assert sent[plan.request_id].get("cache_salt") == plan.cache_salt
            prompt = prompt + output_for(prompt, 4)
    ops = load_history(tmp_path / "history.jsonl")
    assert len(ops) == 16 and {o.process for o in ops} <= {"client-0", "client-1"}
    # a process has at most one request open at a time
    open_by_process: dict[str, str | None] = {}
    for o in ops:
        if o.type == "invoke":
            assert open_by_process.get(o.process) is None
            open_by_process[o.process] = o.request_id
        else:
            assert open_by_process[o.process] == o.request_id
            open_by_process[o.process] = None


def test_cancel_picker(tmp_path):
    spec = WorkloadSpec(families=1, prefix_tokens=4, suffix_tokens=1, requests=4, concurrency=4,
                        max_tokens=3, stream=True)
    conversations = plan_phase(spec, seed=1, phase="c")

    async def body(engine, client, history):
        return await run_conversations(
            client, conversations, phase="c", concurrency=4,
            cancel_for=lambda plan: Cancel(after_first_token=True) if plan.conversation % 2 else None)

    results = run(body, tmp_path)
    assert [results[f"c-{i}-0"].aborted for i in range(4)] == [False, True, False, True]


def test_top_logprobs_by_token_id_best_first():
    from chaos.workload.client import CompletionClient, parse_top_logprobs

    assert parse_top_logprobs([{"token_id:7": -2.0, "token_id:3": -0.5}, {"token_id:9": -0.1, "x": -0.01}, None]) \
        == [[[3, -0.5], [7, -2.0]], [[9, -0.1]], []]
    body = CompletionClient("http://127.0.0.1:1", logprobs=2, cache_stats=True).body(_req("r", False))
    assert body["logprobs"] == 2 and body["return_tokens_as_token_ids"] is True
    assert body["kv_transfer_params"] == {"cached_token_stats": {}} and body["return_token_ids"] is True
    plain = CompletionClient("http://127.0.0.1:1").body(_req("r", False))
    assert "logprobs" not in plain and "kv_transfer_params" not in plain
