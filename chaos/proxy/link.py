"""One direction of one proxied connection: source socket -> toxic chain -> destination socket.

::

    upstream link:    client socket  --read-->  [stub, stub, ...]  --write-->  upstream socket
    downstream link:  upstream socket --read--> [stub, stub, ...]  --write-->  client socket

Two modes, switched per link:

- **fast path** (no toxics on this direction): on Linux the bytes go socket -> pipe -> socket
  with ``splice(2)`` and never enter Python (the transport's own reader is paused and the link
  watches a duplicate of each socket's descriptor); elsewhere, or while the destination's write
  buffer still holds bytes, ``data_received`` writes them straight to the destination
  transport, no queue, no task. Back-pressure: when the destination cannot take more, reading
  from the source pauses.
- **toxic path**: bytes are queued with their read time, and a pump task moves them one chunk
  at a time through the stubs in chain order, then writes them. One pump per link means
  chunks never overtake each other, so adding, updating or removing a toxic mid-stream cannot
  reorder or lose bytes; a removed toxic's sleep is interrupted and it passes on what it held.
  The link returns to the fast path only when the chain is empty and the queue is drained.
  Adding a toxic to a splicing link first writes what the pipe holds to the destination (those
  bytes were read before the toxic existed), then hands reading back to the transport.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
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

#: Whether fast-path links splice(2) (Linux; ``os.splice`` is Python 3.10+). Off with
#: ``KVCHAOS_PROXY_SPLICE=0`` in the proxy's environment (the benchmark compares both); tests
#: turn it off to cover the plain fast path.
SPLICE = (hasattr(os, "splice") and hasattr(fcntl, "F_SETPIPE_SZ")
          and os.environ.get("KVCHAOS_PROXY_SPLICE", "1") != "0")
#: Bytes moved per splice(2) call and the pipe's capacity (F_SETPIPE_SZ; 1 MiB is Linux's
#: default /proc/sys/fs/pipe-max-size, so an unprivileged process may ask for it).
SPLICE_CHUNK = 1024 * 1024
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
_WOULD_BLOCK = (errno.EAGAIN, errno.EWOULDBLOCK)


class _Splicer:
    """Zero-copy forwarding for one fast-path link: source fd -> pipe -> destination fd.

    Works on duplicates of the transports' descriptors, so the event loop can watch them while
    the transports (reading paused, write buffer empty) still own the sockets.

    Raises:
        OSError: from ``pipe``/``dup`` when descriptors run out (the link then stays on the
            plain fast path).
    """

    def __init__(self, link: ToxicLink, src_fd: int, dst_fd: int) -> None:
        self.link = link
        self.loop = asyncio.get_running_loop()
        self.pipe_r, self.pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.src = self.dst = -1
        try:
            try:
                fcntl.fcntl(self.pipe_w, fcntl.F_SETPIPE_SZ, SPLICE_CHUNK)
            except OSError:
                pass  # a smaller pipe only means more calls
            self.src = os.dup(src_fd)
            self.dst = os.dup(dst_fd)
        except OSError:
            self._close_fds()
            raise
        self.in_pipe = 0  # bytes read from the source not yet written to the destination
        self.reading = False
        self.writing = False
        self.stopped = False

    def start(self) -> None:
        """Watch the source for readable data."""
        self._want_read(True)

    def _want_read(self, on: bool) -> None:
        if on and not self.reading and not self.stopped:
            self.loop.add_reader(self.src, self._readable)
            self.reading = True
        elif not on and self.reading:
            self.loop.remove_reader(self.src)
            self.reading = False

    def _want_write(self, on: bool) -> None:
        if on and not self.writing and not self.stopped:
            self.loop.add_writer(self.dst, self._writable)
            self.writing = True
        elif not on and self.writing:
            self.loop.remove_writer(self.dst)
            self.writing = False

    def _readable(self) -> None:
        link = self.link
        try:
            n = os.splice(self.src, self.pipe_w, SPLICE_CHUNK, flags=_SPLICE_FLAGS)
        except OSError as exc:
            if exc.errno in _WOULD_BLOCK:
                return
            log.debug("%s link: splice from source failed: %s", link.direction, exc)
            link.connection.close()
            return
        if n == 0:  # FIN from the source
            self._want_read(False)
            link.eof = True
            if self.in_pipe == 0:
                link._finish_eof()
            return
        self.in_pipe += n
        link.count_received(n)
        self._drain()

    def _writable(self) -> None:
        self._drain()

    def _drain(self) -> None:
        """Move what the pipe holds to the destination; wait for it to drain when it is full."""
        link = self.link
        while self.in_pipe:
            try:
                n = os.splice(self.pipe_r, self.dst, self.in_pipe, flags=_SPLICE_FLAGS)
            except OSError as exc:
                if exc.errno in _WOULD_BLOCK:
                    self._want_read(False)  # back-pressure: stop reading until it drains
                    self._want_write(True)
                    return
                log.debug("%s link: splice to destination failed: %s", link.direction, exc)
                link.connection.close()
                return
            self.in_pipe -= n
            link.count_sent(n)
        self._want_write(False)
        if link.eof:
            link._finish_eof()
        else:
            self._want_read(True)

    def stop(self) -> bytes:
        """Stop watching both descriptors and return the bytes still in the pipe (read from
        the source, never written), to be written by the transport before anything else."""
        self._want_read(False)
        self._want_write(False)
        self.stopped = True
        held = bytearray()
        while self.in_pipe > 0:
            try:
                data = os.read(self.pipe_r, self.in_pipe)
            except OSError:
                break
            if not data:
                break
            held += data
            self.in_pipe -= len(data)
        self._close_fds()
        return bytes(held)

    def _close_fds(self) -> None:
        for fd in (self.src, self.dst, self.pipe_r, self.pipe_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.src = self.dst = self.pipe_r = self.pipe_w = -1


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
        self.splicer: _Splicer | None = None
        self._splice_ok = SPLICE  # False once setting up a splice failed for this link
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
        self.received_bytes = 0  # this link's share, added to the at-close counters at close()
        self.sent_bytes = 0

    # --- counters -----------------------------------------------------------------------
    def count_received(self, n: int) -> None:
        """``n`` bytes read from the source: the proxy's live counter now, this link's total
        (added to Toxiproxy's at-close ``toxiproxy_proxy_received_bytes_total`` at close)."""
        self.stats.received[self.direction] += n
        self.received_bytes += n

    def count_sent(self, n: int) -> None:
        """``n`` bytes written to the destination (live counter now, at-close counter later)."""
        self.stats.sent[self.direction] += n
        self.sent_bytes += n

    # --- wiring -----------------------------------------------------------------------
    def attach(self, source: asyncio.Transport, dest: asyncio.Transport) -> None:
        """Set the transports this link reads from and writes to."""
        self.source = source
        self.dest = dest
        if not self.stubs and not self.queue and not self.eof:
            self.fast = True
            self._try_splice()
        else:
            self._wake()

    def start_reading(self) -> None:
        """Let the source transport read (the client's is paused until the upstream is open),
        unless this link splices or flow control holds it."""
        if self.source is not None and self.splicer is None and not self.reading_paused:
            self.source.resume_reading()

    # --- splice(2) on the fast path ---------------------------------------------------------
    def _try_splice(self) -> None:
        """Hand a fast-path link to a _Splicer when both ends are sockets and the destination's
        write buffer is empty (so nothing written earlier can be overtaken)."""
        if (not self._splice_ok or self.splicer is not None or not self.fast or self.closed
                or self.eof or self.dest_paused or self.source is None or self.dest is None
                or self.source.is_closing() or self.dest.is_closing()
                or self.dest.get_write_buffer_size() != 0):
            return
        src = self.source.get_extra_info("socket")
        dst = self.dest.get_extra_info("socket")
        if src is None or dst is None:
            self._splice_ok = False
            return
        try:
            self.splicer = _Splicer(self, src.fileno(), dst.fileno())
        except OSError as exc:
            log.debug("%s link: no splice (%s); plain fast path", self.direction, exc)
            self._splice_ok = False
            return
        self.source.pause_reading()
        self.splicer.start()

    def _stop_splice(self) -> None:
        """Back from splicing to the transports: what the pipe held goes to the destination
        first, then the source transport reads again (or the FIN seen meanwhile goes on)."""
        splicer, self.splicer = self.splicer, None
        if splicer is None:
            return
        held = splicer.stop()
        if self.closed:
            return
        if held and self.dest is not None and not self.dest.is_closing():
            self.dest.write(held)
            self.count_sent(len(held))
        if self.eof:
            self._finish_eof()
        elif self.source is not None:
            self.reading_paused = False
            self.source.resume_reading()
            self._flow()

    # --- toxics on a live link ----------------------------------------------------------
    def add_stub(self, wrapper: ToxicWrapper) -> ToxicStub:
        """Append a running stub for ``wrapper`` (toxicity rolled now) to the chain."""
        stub = ToxicStub(wrapper, self, self.rng)
        self.stubs.append(stub)
        self.fast = False
        self._stop_splice()
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
        self.count_received(n)
        if self.closed:  # a read that raced the close: nowhere to send it
            return
        if self.fast:
            self.dest.write(data)  # type: ignore[union-attr]
            self.count_sent(n)
            if self._splice_ok:
                self._try_splice()
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
        if self.source is None or self.closed or self.splicer is not None:
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
                    self._try_splice()
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
        self.count_sent(len(chunk.data))
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
        self._stop_splice()
        self.stats.link_closed(self.direction, self.received_bytes, self.sent_bytes)
        for stub in self.stubs:
            stub.interrupt()
        self.queue.clear()
        self.queued_bytes = 0
        task = self._pump_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        self._resolve_waiter()
