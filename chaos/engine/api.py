"""The engine's HTTP surface (FastAPI): vLLM's completions API subset, metrics, state, hooks.

Contract: docs/architecture.md section 2. A client that disconnects (stream or not) aborts
its request: the scheduler frees its blocks, its LMCache lookup locks and its session.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from chaos.engine.protocol import (BugsSwitch, CompletionRequest, LMCacheCallHook, PreemptHook, StallHook,
                                   error_body)
from chaos.engine.request import Request, TokenEvent
from chaos.engine.scheduler import EngineCore, RequestRejected
from chaos.engine.tokenizer import ByteTokenizer

log = logging.getLogger("kvchaos.engine.api")

DISCONNECT_POLL_S = 0.1


def _bad_request(message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, 400, "BadRequestError", param), status_code=400)


def _logprobs_block(events: list[TokenEvent]) -> dict[str, Any]:
    """OpenAI completions ``logprobs`` (tokens spelled ``token_id:N`` as vLLM's
    ``--return-tokens-as-token-ids`` does, so that they are unique)."""
    return {
        "tokens": [f"token_id:{e.token_id}" for e in events],
        "token_logprobs": [e.logprob for e in events],
        "top_logprobs": [
            {f"token_id:{t}": lp for t, lp in (e.top_logprobs or {}).items()} for e in events
        ],
        "text_offset": list(range(len(events))),
    }


def debug_routes_enabled() -> bool:
    """``KVCHAOS_ENGINE_DEBUG_ROUTES=0`` leaves ``/debug/*`` out (an engine that shows nothing of
    its insides, as a stock vLLM; chaos/diagnose must still diagnose through LMCache alone)."""
    import os

    return os.environ.get("KVCHAOS_ENGINE_DEBUG_ROUTES", "1").strip() not in ("0", "false", "no", "off")


def create_app(core: EngineCore) -> FastAPI:
    """Build the FastAPI app around a started ``EngineCore``.

    Args:
        core: the engine.

    Returns:
        the ASGI app.
    """
    app = FastAPI(title="kvchaos reference engine", docs_url=None, redoc_url=None)
    tok = ByteTokenizer()
    cfg = core.config

    @app.exception_handler(RequestValidationError)
    async def _validation(_: HttpRequest, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        parts, param = [], None
        for e in errors:
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            param = param or loc or None
            parts.append(f"{loc or 'body'}: {e.get('msg')}")
        return _bad_request("; ".join(parts) or "invalid request", param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: HttpRequest, exc: StarletteHTTPException) -> JSONResponse:
        kind = "NotFoundError" if exc.status_code == 404 else "BadRequestError"
        return JSONResponse(error_body(str(exc.detail), exc.status_code, kind),
                            status_code=exc.status_code)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{
            "id": cfg.served_model_name, "object": "model", "created": int(core.started_at),
            "owned_by": "kvchaos", "root": cfg.served_model_name,
            "max_model_len": core.capacity_tokens, "fingerprint": core.fingerprint}]})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(core.metrics.render(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    if debug_routes_enabled():
        @app.get("/debug/state")
        async def debug_state() -> JSONResponse:
            return JSONResponse(await run_in_threadpool(core.debug_state))

        @app.put("/debug/bugs")
        async def debug_bugs(body: BugsSwitch) -> JSONResponse:
            """Replace the planted bugs (tests only: one engine for every planted bug, where a
            start per bug cost seconds each). 400 an unknown name, 409 while a request is in the
            engine (the switch happens between steps, never under a request)."""
            try:
                res = await asyncio.wrap_future(core.hook("bugs", body.bugs))
            except ValueError as exc:
                return _bad_request(str(exc), "bugs")
            except RuntimeError as exc:
                return JSONResponse(error_body(str(exc), 409, "ConflictError"), status_code=409)
            return JSONResponse(res)

        @app.post("/debug/kv/{request_id}")
        async def debug_kv_arm(request_id: str) -> JSONResponse:
            """Arm a capture of the prompt KV of the request ``request_id`` (send it after)."""
            core.arm_kv_capture(request_id)
            return JSONResponse({"request_id": request_id, "armed": True})

        @app.get("/debug/kv/{request_id}")
        async def debug_kv(request_id: str) -> Any:
            """The KV the request attends over after its prefill (loaded, then computed): raw
            little-endian bytes of ``[2, num_layers, prompt_tokens, num_kv_heads * head_size]``
            (K then V); headers ``X-KV-Shape`` (comma-separated), ``X-KV-Dtype``,
            ``X-KV-Local-Hit-Tokens``, ``X-KV-External-Hit-Tokens``. 404 not armed, 409 armed
            and its prefill has not ended."""
            armed, cap = core.kv_capture(request_id)
            if not armed:
                return JSONResponse(error_body(f"no KV capture armed for {request_id!r}", 404, "NotFoundError"),
                                    status_code=404)
            if cap is None:
                return JSONResponse(error_body(f"{request_id!r} has not finished its prefill", 409,
                                               "ConflictError"), status_code=409)
            import torch

            kv = cap["kv"].contiguous()
            raw = kv.view(torch.int16) if kv.dtype == torch.bfloat16 else kv  # numpy has no bfloat16
            return Response(raw.numpy().tobytes(), media_type="application/octet-stream", headers={
                "X-KV-Shape": ",".join(str(n) for n in kv.shape), "X-KV-Dtype": str(kv.dtype).removeprefix("torch."),
                "X-KV-Local-Hit-Tokens": str(cap["local_hit_tokens"]),
                "X-KV-External-Hit-Tokens": str(cap["external_hit_tokens"])})

    @app.get("/debug/requests/{request_id}")
    async def debug_request(request_id: str, wait_for: str | None = None,
                            timeout_s: float = 30.0) -> Any:
        """Where one request is (its stage) and, after an abort, the stage it arrived in.

        With ``wait_for=STAGE`` the answer is two JSON lines (``application/x-ndjson``): the
        first as soon as the watch is registered (so a client may send the request only then,
        and cannot miss a short stage), the second once the request enters that stage or ends,
        or after ``timeout_s``; ``reached`` says whether it entered it. An id not seen yet is
        waited for too.
        """
        if wait_for is None:
            view = core.request_view(request_id)
            if view is None:
                return JSONResponse(error_body(f"no request {request_id!r}", 404, "NotFoundError"),
                                    status_code=404)
            return JSONResponse(view)
        loop = asyncio.get_running_loop()
        entered: asyncio.Future = loop.create_future()

        def on_stage(stage: str) -> None:
            loop.call_soon_threadsafe(lambda: entered.done() or entered.set_result(stage))

        try:
            token = core.watch_stage(request_id, wait_for, on_stage)
        except ValueError as exc:
            return _bad_request(str(exc), "wait_for")

        async def lines() -> AsyncIterator[str]:
            try:
                view = core.request_view(request_id)
                stage = view["stage"] if view else None
                yield json.dumps({"request_id": request_id, "watching": wait_for, "stage": stage}) + "\n"
                if stage != wait_for and stage not in ("finished", "aborted"):
                    try:
                        stage = await asyncio.wait_for(asyncio.shield(entered), max(0.0, timeout_s))
                    except asyncio.TimeoutError:
                        pass
                view = core.request_view(request_id) or {"request_id": request_id, "stage": None,
                                                          "abort": None}
                yield json.dumps({**view, "reached": stage == wait_for, "entered": stage}) + "\n"
            finally:
                core.unwatch_stage(token)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/hooks/preempt")
    async def hook_preempt(body: PreemptHook) -> JSONResponse:
        ids = await asyncio.wrap_future(core.hook("preempt", body.request_id))
        return JSONResponse({"preempted": ids})

    @app.post("/hooks/stall")
    async def hook_stall(body: StallHook) -> JSONResponse:
        try:
            res = await asyncio.wrap_future(
                core.hook("stall", (body.point, body.seconds, body.count)))
        except ValueError as exc:
            return _bad_request(str(exc), "point")
        return JSONResponse(res)

    @app.post("/hooks/lmcache")
    async def hook_lmcache(body: LMCacheCallHook) -> JSONResponse:
        try:
            res = await asyncio.wrap_future(
                core.hook("lmcache", (body.call, body.request_id, body.tokens)))
        except ValueError as exc:
            return _bad_request(str(exc), "call")
        except RuntimeError as exc:
            return JSONResponse(error_body(str(exc), 503, "ServiceUnavailableError"), status_code=503)
        return JSONResponse(res)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> JSONResponse:
        await asyncio.wrap_future(core.hook("reset_prefix_cache", None))
        return JSONResponse({})

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: HttpRequest) -> Any:
        request_id = http.headers.get("x-request-id") or uuid.uuid4().hex
        if isinstance(body.prompt, str):
            prompt = tok.encode(body.prompt)
        else:
            prompt = list(body.prompt)
            bad = [t for t in prompt if not 0 <= t < cfg.model.vocab_size]
            if bad:
                return _bad_request(f"token ids out of range [0, {cfg.model.vocab_size}): "
                                    f"{bad[:5]}", "prompt")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        req = Request(request_id=request_id, prompt=prompt, max_tokens=body.max_tokens,
                      cache_salt=body.cache_salt, logprobs=body.logprobs,
                      ignore_eos=body.ignore_eos)
        req.sink = lambda ev: loop.call_soon_threadsafe(queue.put_nowait, ev)
        try:
            core.add_request(req)
        except RequestRejected as exc:
            return _bad_request(str(exc), "prompt")
        created = int(time.time())
        cid = f"cmpl-{request_id}"

        def final_fields(finish_reason: str | None) -> dict[str, Any]:
            stats = {
                "local_cache_hit_tokens": req.local_hit_tokens,
                "external_cache_hit_tokens": req.external_hit_tokens,
                "lookup": req.lookup_status if req.lookup_status != "unset" else "disabled",
                "load_failed_tokens": req.load_failed_tokens,
                "num_preemptions": req.num_preemptions,
            }
            return {
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(req.output),
                    "total_tokens": len(prompt) + len(req.output),
                    "prompt_tokens_details": {
                        "cached_tokens": req.local_hit_tokens + req.external_hit_tokens},
                },
                "kv_transfer_params": {"cached_token_stats": stats},
            }

        if body.stream:
            return StreamingResponse(
                _stream(core, req, queue, cid, created, cfg.served_model_name, body, tok,
                        final_fields),
                media_type="text/event-stream", headers={"X-Request-Id": request_id})

        events: list[TokenEvent] = []
        done = False
        last_check = time.monotonic()
        try:
            while True:
                try:
                    ev = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    ev = None
                if time.monotonic() - last_check >= DISCONNECT_POLL_S:
                    last_check = time.monotonic()
                    if await http.is_disconnected():
                        log.info("client of %s disconnected; aborting", request_id)
                        return JSONResponse({}, status_code=499)
                if ev is None:
                    continue
                if ev.final:
                    done = True
                    if ev.error:
                        kind = "InternalServerError" if ev.error_code >= 500 else "BadRequestError"
                        return JSONResponse(error_body(ev.error, ev.error_code, kind),
                                            status_code=ev.error_code)
                    finish = ev.finish_reason
                    break
                events.append(ev)
        finally:
            if not done:
                core.abort(request_id)
        out_ids = [e.token_id for e in events]
        choice = {"index": 0, "text": tok.decode(out_ids), "token_ids": out_ids,
                  "prompt_token_ids": prompt,
                  "logprobs": _logprobs_block(events) if body.logprobs is not None else None,
                  "finish_reason": finish, "stop_reason": None}
        return JSONResponse({"id": cid, "object": "text_completion", "created": created,
                             "model": cfg.served_model_name, "choices": [choice],
                             **final_fields(finish)}, headers={"X-Request-Id": request_id})

    return app


async def _stream(core: EngineCore, req: Request, queue: asyncio.Queue, cid: str,
                  created: int, model: str, body: CompletionRequest, tok: ByteTokenizer,
                  final_fields: Any) -> AsyncIterator[str]:
    """SSE events: one per token, then a final one with usage and kv_transfer_params."""
    done = False
    first = True
    try:
        while True:
            ev: TokenEvent = await queue.get()
            if ev.final:
                done = True
                if ev.error:
                    kind = "InternalServerError" if ev.error_code >= 500 else "BadRequestError"
                    yield "data: " + json.dumps(
                        {"error": error_body(ev.error, ev.error_code, kind)}) + "\n\n"
                else:
                    chunk = {"id": cid, "object": "text_completion", "created": created,
                             "model": model,
                             "choices": [{"index": 0, "text": "", "token_ids": [],
                                          "logprobs": None,
                                          "finish_reason": ev.finish_reason}],
                             **final_fields(ev.finish_reason)}
                    yield "data: " + json.dumps(chunk) + "\n\n"
                yield "data: [DONE]\n\n"
                return
            choice: dict[str, Any] = {"index": 0, "text": tok.token_text(ev.token_id),
                                      "token_ids": [ev.token_id], "logprobs": None,
                                      "finish_reason": None}
            if first:
                choice["prompt_token_ids"] = req.prompt
                first = False
            if body.logprobs is not None:
                choice["logprobs"] = _logprobs_block([ev])
            yield "data: " + json.dumps({"id": cid, "object": "text_completion",
                                         "created": created, "model": model,
                                         "choices": [choice]}) + "\n\n"
    finally:
        if not done:
            log.info("stream of %s closed early; aborting", req.request_id)
            core.abort(req.request_id)
