"""The workload client never reuses a connection the engine's server may be closing.

The input (2026-12-03, `make test` under 4 busy loops, two stacks at once): lookup-timeout
failed liveness on the clean engine, "recover-1-0: ReadError". client-1 had been idle 4.98 s
(the settle phase) and sent its next request on its pooled connection just as uvicorn closed it
at its 5 s ``timeout_keep_alive``; httpx kept idle connections 5 s as well. The engine never saw
the request.

The race is made deterministic here by a relay in front of the engine double that behaves as a
server whose keep-alive timer fired just as the request arrived: a request that comes on a
connection idle for longer than ``SERVER_KEEPALIVE_S`` is dropped and the connection closed.
"""

from __future__ import annotations

import asyncio

import uvicorn

from chaos.history import HistoryWriter
from chaos.httppool import KEEPALIVE_EXPIRY_S
from chaos.workload.client import CompletionClient, CompletionRequest

from .engine_double import EngineDouble, output_for

PROMPT = [80, 81, 82] * 10
SERVER_KEEPALIVE_S = 1.5  # stands for uvicorn's 5 s, scaled down
PAUSE_S = 2.0  # a settle phase between two requests of one client


class ClosingRelay:
    """TCP relay to ``upstream`` port; drops a request that arrives on a client connection idle
    for more than ``idle_s`` (closes both sides, forwards nothing). Counts connections."""

    def __init__(self, upstream_port: int, idle_s: float) -> None:
        self.upstream_port = upstream_port
        self.idle_s = idle_s
        self.connections = 0
        self.dropped = 0
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.connections += 1
        ureader, uwriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        loop = asyncio.get_running_loop()
        last = loop.time()

        async def down() -> None:
            nonlocal last
            while data := await ureader.read(65536):
                cwriter.write(data)
                await cwriter.drain()
                last = loop.time()

        pump = asyncio.create_task(down())
        try:
            while data := await creader.read(65536):
                if loop.time() - last > self.idle_s:  # the server's keep-alive timer won
                    self.dropped += 1
                    break
                uwriter.write(data)
                await uwriter.drain()
                last = loop.time()
        finally:
            pump.cancel()
            for w in (cwriter, uwriter):
                w.close()


def _req(rid: str) -> CompletionRequest:
    return CompletionRequest(request_id=rid, prompt_token_ids=PROMPT, max_tokens=4, stream=False,
                             family=0, turn=0)


def test_a_request_after_a_pause_does_not_reuse_a_connection_the_server_is_closing(tmp_path):
    async def main():
        engine = EngineDouble()
        await engine.start()
        relay = ClosingRelay(int(engine.url.rsplit(":", 1)[1]), SERVER_KEEPALIVE_S)
        await relay.start()
        history = HistoryWriter(tmp_path / "history.jsonl")
        try:
            async with CompletionClient(f"http://127.0.0.1:{relay.port}", history=history) as client:
                first = await client.complete(_req("settle-0-0"))
                await asyncio.sleep(PAUSE_S)
                second = await client.complete(_req("recover-0-0"))
            return first, second, relay
        finally:
            history.close()
            await relay.stop()
            await engine.stop()

    first, second, relay = asyncio.run(main())
    assert first.type == "ok"
    # Before: httpx's 5 s keep-alive reused the idle connection, the relay dropped the request,
    # and the outcome was info "ReadError" (a liveness failure the engine never caused).
    assert second.type == "ok" and second.token_ids == output_for(PROMPT, 4), (second.type, second.error)
    assert relay.dropped == 0 and relay.connections == 2


def test_the_client_expires_idle_connections_before_uvicorns_keep_alive_closes_them():
    # uvicorn serves vLLM and the reference engine; its default timeout_keep_alive is
    # the server-side clock the client must stay under (with margin for a loaded host).
    server_keep_alive = uvicorn.Config(app=None).timeout_keep_alive
    assert KEEPALIVE_EXPIRY_S <= server_keep_alive / 2, (KEEPALIVE_EXPIRY_S, server_keep_alive)
