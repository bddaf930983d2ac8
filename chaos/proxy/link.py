"""One direction of one proxied connection: source socket -> toxic chain -> destination socket.

::

    upstream link:    client socket  --read-->  [stub, stub, ...]  --write-->  upstream socket
    downstream link:  upstream socket --read--> [stub, stub, ...]  --write-->  client socket

Two modes, switched per link:

- **fast path** (no toxics on this direction): ``data_received`` writes the bytes straight to
  the destination transport, no queue, no task, no copy. Back-pressure: when the destination's
  write buffer passes its high-water mark, reading from the source pauses.
- **toxic path**: bytes are queued with their read time, and a pump task moves them one chunk
  at a time through the stubs in chain order, then writes them. One pump per link means
  chunks never overtake each other, so adding, updating or removing a toxic mid-stream cannot
  reorder or lose bytes; a removed toxic's sleep is interrupted and it passes on what it held.
  The link returns to the fast path only when the chain is empty and the queue is drained.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from typing import TYPE_CHECKING

from chaos.proxy.toxics.toxic import Chunk, ToxicStub

if TYPE_CHECKING:
    from chaos.proxy.connection import Connection
    from chaos.proxy.metrics import ProxyStats
    from chaos.proxy.toxic_collection import ToxicWrapper

log = logging.getLogger(__name__)

# Queue bounds of the toxic path, in bytes: pause reading the source above HIGH, resume below
# LOW. A stalled toxic (latency, timeout 0) then holds at most ~HIGH bytes per link.
QUEUE_HIGH = 4 * 1024 * 1024
QUEUE_LOW = 1 * 1024 * 1024


class ToxicLink:
    """Moves bytes in one direction ("upstream": client->server, "downstream": back)."""

    def __init__(
        self,
        connection: Connection,
        direction: str,
        chain: list[ToxicWrapper],
        stats: ProxyStats,
        rng: random.Random,
    ) -> None:
        self.connection = connection
        self.direction = direction
        self.stats = stats
        self.rng = rng
        self.source: asyncio.Transport | None = None
        self.dest: asyncio.Transport | None = None
        self.stubs: list[ToxicStub] = []
        for wrapper in chain:
            self.add_stub(wrapper)
        self.fast = False  # until attach(): bytes read before the upstream is open queue up
        self.queue: deque[tuple[bytes, float]] = deque()
        self.queued_bytes = 0
        self.eof = False  # the source sent FIN
        self.done = False  # FIN passed on to the destination
        self.closed = False
        self.dest_paused = False
        self.reading_paused = False
        self._pump_task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None

    # --- wiring -----------------------------------------------------------------------
    def attach(self, source: asyncio.Transport, dest: asyncio.Transport) -> None:
        """Set the transports this link reads from and writes to."""
        self.source = source
        self.dest = dest
        if not self.stubs and not self.queue and not self.eof:
            self.fast = True
        else:
            self._wake()

    # --- toxics on a live link ----------------------------------------------------------
    def add_stub(self, wrapper: ToxicWrapper) -> ToxicStub:
        """Append a running stub for ``wrapper`` (toxicity rolled now) to the chain."""
        stub = ToxicStub(wrapper, self, self.rng)
        self.stubs.append(stub)
        self.fast = False
        if stub.active:
            stub.toxic.start(stub)
        return stub

    def update_stub(self, wrapper: ToxicWrapper) -> None:
        """Restart the stub of ``wrapper`` with its new settings (re-roll, like Toxiproxy)."""
        for stub in self.stubs:
            if stub.wrapper is wrapper:
                stub.interrupt()
                stub.roll(self.rng)
                if stub.active:
                    stub.toxic.start(stub)

    def remove_stub(self, wrapper: ToxicWrapper) -> None:
        """Take ``wrapper``'s stub out of the chain; what it holds is passed on, not dropped."""
        for stub in list(self.stubs):
            if stub.wrapper is wrapper:
                stub.removed = True
                stub.interrupt()
                self.stubs.remove(stub)
                if stub.active:
                    stub.toxic.cleanup(stub)
        self._wake()

    # --- data from the source -----------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Take bytes read from the source (called from ``Protocol.data_received``)."""
        n = len(data)
        self.stats.received[self.direction] += n
        if self.closed:  # a read that raced the close: nowhere to send it
            return
        if self.fast:
            self.dest.write(data)  # type: ignore[union-attr]
            self.stats.sent[self.direction] += n
            return
        self.queue.append((data, asyncio.get_running_loop().time()))
        self.queued_bytes += n
        self._flow()
        self._wake()

    def feed_eof(self) -> None:
        """The source half-closed (FIN); pass it on after the bytes before it."""
        if self.eof:
            return
        self.eof = True
        if self.fast:
            self._finish_eof()
        else:
            self._wake()

    # --- flow control from the destination ------------------------------------------------
    def pause_dest(self) -> None:
        """The destination's write buffer is full (``Protocol.pause_writing``)."""
        self.dest_paused = True
        self._flow()

    def resume_dest(self) -> None:
        """The destination drained (``Protocol.resume_writing``)."""
        self.dest_paused = False
        self._flow()
        self._resolve_waiter()

    def _flow(self) -> None:
        if self.source is None or self.closed:
            return
        if self.dest_paused or self.queued_bytes >= QUEUE_HIGH:
            if not self.reading_paused:
                self.reading_paused = True
                self.source.pause_reading()
        elif self.reading_paused and self.queued_bytes <= QUEUE_LOW:
            self.reading_paused = False
            self.source.resume_reading()

    # --- the toxic path -------------------------------------------------------------------
    def _wake(self) -> None:
        if self.closed or self.fast or self.dest is None:
            return
        if self._pump_task is None:
            self._pump_task = asyncio.get_running_loop().create_task(self._pump())
        else:
            self._resolve_waiter()

    def _resolve_waiter(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def _pump(self) -> None:
        try:
            while not self.closed:
                if self.queue:
                    data, read_at = self.queue.popleft()
                    self.queued_bytes -= len(data)
                    self._flow()
                    await self._run(tuple(self.stubs), 0, Chunk(data, read_at))
                elif self.eof:
                    for stub in tuple(self.stubs):
                        if stub.active and not stub.removed:
                            await stub.toxic.on_eof(stub)
                        if self.closed:
                            return
                    self._finish_eof()
                    return
                elif not self.stubs:
                    self.fast = True  # queue drained, chain empty: back to full speed
                    return
                else:
                    await self._wait()
        except asyncio.CancelledError:
            pass
        except Exception:  # a toxic bug must not kill the server; drop this connection
            log.exception("toxic chain failed on %s link; closing the connection", self.direction)
            self.connection.close()
        finally:
            self._pump_task = None

    async def _run(self, stubs: tuple[ToxicStub, ...], index: int, chunk: Chunk) -> None:
        while index < len(stubs):
            stub = stubs[index]
            if stub.active and not stub.removed:
                if stub.toxic.acts_on_every_chunk:
                    stub.mark_acted()
                nxt = index + 1

                async def emit(c: Chunk, _nxt: int = nxt) -> None:
                    await self._run(stubs, _nxt, c)

                await stub.toxic.pipe(stub, chunk, emit)
                return
            index += 1
        await self._deliver(chunk)

    async def _deliver(self, chunk: Chunk) -> None:
        if self.closed or not chunk.data:
            return
        self.dest.write(chunk.data)  # type: ignore[union-attr]
        self.stats.sent[self.direction] += len(chunk.data)
        while self.dest_paused and not self.closed:
            await self._wait()

    def _finish_eof(self) -> None:
        if self.done or self.closed:
            return
        self.done = True
        dest = self.dest
        if dest is not None and not dest.is_closing() and dest.can_write_eof():
            dest.write_eof()
        self.connection.link_done()

    # --- teardown -------------------------------------------------------------------------
    def close(self) -> None:
        """Stop moving data: cancel the pump and all stub timers (the connection closes)."""
        if self.closed:
            return
        self.closed = True
        for stub in self.stubs:
            stub.interrupt()
        self.queue.clear()
        self.queued_bytes = 0
        task = self._pump_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        self._resolve_waiter()
