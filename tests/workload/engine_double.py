"""A test double of the engine's /v1/completions (aiohttp), for client tests only.

Output is a pure function of the prompt (token i = (sum(prompt) + i) % 95 + 32), like a greedy
engine. A request's behaviour is chosen by its X-Request-Id suffix:
``...-e400`` / ``...-e500`` error answers, ``...-slow`` 50 ms per token, ``...-hang`` never
answers, ``...-cut`` closes the stream after 2 tokens with no [DONE], ``...-errevent`` sends an
error event mid-stream. ``stats`` sets the cached_token_stats answered.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web


def output_for(prompt: list[int], n: int) -> list[int]:
    return [(sum(prompt) + i) % 95 + 32 for i in range(n)]


class EngineDouble:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.disconnected: list[str] = []
        self.stats: dict[str, Any] = {"local_cache_hit_tokens": 0, "external_cache_hit_tokens": 0,
                                      "lookup": "miss", "load_failed_tokens": 0, "num_preemptions": 0}
        self.in_flight = 0
        self.max_in_flight = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        rid = request.headers.get("X-Request-Id", "")
        body = await request.json()
        self.requests.append({"request_id": rid, **body})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request, rid, body)
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnected.append(rid)
            raise
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request, rid: str, body: dict) -> web.StreamResponse:
        if rid.endswith("-e400"):
            return web.json_response({"object": "error", "message": "bad prompt", "type": "BadRequestError",
                                      "param": None, "code": 400}, status=400)
        if rid.endswith("-e500"):
            return web.json_response({"object": "error", "message": "load failed", "code": 500}, status=500)
        if rid.endswith("-hang"):
            await asyncio.sleep(3600)
        prompt = body["prompt"]
        ids = output_for(prompt, body["max_tokens"])
        final = {
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                      "total_tokens": len(prompt) + len(ids),
                      "prompt_tokens_details": {"cached_tokens": self.stats["local_cache_hit_tokens"]
                                                + self.stats["external_cache_hit_tokens"]}},
            "kv_transfer_params": {"cached_token_stats": dict(self.stats)},
        }
        if not body.get("stream"):
            await asyncio.sleep(0.01)
            return web.json_response({
                "id": f"cmpl-{rid}", "object": "text_completion", "model": body.get("model"),
                "choices": [{"index": 0, "text": bytes(ids).decode(), "token_ids": ids,
                             "prompt_token_ids": prompt, "logprobs": None, "finish_reason": "length"}],
                **final})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        delay = 0.05 if rid.endswith("-slow") else 0.005
        for i, t in enumerate(ids):
            if rid.endswith("-cut") and i == 2:
                request.transport.close()  # type: ignore[union-attr]
                return resp
            if rid.endswith("-errevent") and i == 1:
                await resp.write(b'data: {"error": {"message": "boom"}}\n\n')
                return resp
            await asyncio.sleep(delay)
            event: dict[str, Any] = {"id": f"cmpl-{rid}", "choices": [
                {"index": 0, "text": chr(t), "token_ids": [t],
                 "finish_reason": "length" if i == len(ids) - 1 else None}]}
            if i == len(ids) - 1:
                event.update(final)
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp
