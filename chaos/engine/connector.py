"""LMCache connector: LMCache's own MP adapters, called the way vLLM's LMCacheMPConnector does.

Per request (vLLM ``LMCacheMPConnector``, lmcache ``integration/vllm/vllm_multi_process_adapter``):

    scheduler side  maybe_submit_lookup_request ─> check_lookup_result (polled each step;
                    None = prefetch still running) ─> [free_lookup_locks for chunks the
                    engine will not retrieve] ─> end_session + cleanup_lookup_result
    worker side     register_kv_caches (once; re-registered by the adapter's heartbeat after
                    a server restart) ─> submit_retrieve_request into the request's blocks ─>
                    get_finished / get_failed_request_ids ─> compute the rest ─>
                    submit_store_request (full chunks only)

The worker runs LMCache's engine-driven transfer on CPU (synchronous gather/scatter through
shared memory), so a retrieve or store has finished when its submit returns. Every MQ call is
bounded by ``mq_timeout``. While the server is unhealthy the adapters drop calls; the
clean-ups we could not send (lock frees, END_SESSION) are kept and sent once it is healthy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from chaos.engine.environment import apply_lmcache_environment
from chaos.engine.kv_pool import KVPool

apply_lmcache_environment()

log = logging.getLogger("kvchaos.engine.connector")


@dataclass
class LookupOutcome:
    """Result of polling a lookup.

    Attributes:
        status: ``pending`` | ``hit`` | ``miss`` | ``timeout`` | ``error``.
        tokens: tokens LMCache holds for the prefix (multiple of the chunk size).
    """

    status: str
    tokens: int = 0


class LMCacheConnector:
    """One engine's link to an LMCache MP server (scheduler and worker adapter)."""

    def __init__(self, url: str, model_name: str, block_size: int, pool: KVPool,
                 mq_timeout: float, heartbeat_interval: float, prefill_segment: int,
                 on_state_change: Callable[[], None] | None = None) -> None:
        """Prepare the connector; ``start()`` connects.

        Args:
            url: the LMCache server's ZMQ address, ``tcp://HOST:PORT``.
            model_name: model name in LMCache keys (include the engine fingerprint).
            block_size: engine block size (tokens); must divide the server's chunk size.
            pool: the KV pool registered with LMCache.
            mq_timeout: seconds any LMCache MQ call may take.
            heartbeat_interval: seconds between the adapters' health pings.
            prefill_segment: the engine's canonical segment; must divide the chunk size, or
                a hit could end inside a segment and break bit-exactness.
            on_state_change: called (from a background thread) when the connection is made.
        """
        self.url = url
        self.model_name = model_name
        self.block_size = block_size
        self.pool = pool
        self.mq_timeout = mq_timeout
        self.heartbeat_interval = heartbeat_interval
        self.prefill_segment = prefill_segment
        self.chunk_size: int | None = None
        self.scheduler = None
        self.worker = None
        self.connect_error: str | None = None
        self._on_state_change = on_state_change
        self._lookup_started: dict[str, float] = {}
        # Lookups sent per request id: a deferred END_SESSION for an earlier attempt (the
        # request was preempted while LMCache was unhealthy) must not end a later one.
        self._attempt: dict[str, int] = {}
        self.open_sessions: set[str] = set()
        self._deferred: list[tuple[str, Callable[[], None]]] = []
        self._stop = threading.Event()
        self._connect_thread: threading.Thread | None = None

    # ---- connection -------------------------------------------------------------------
    def start(self) -> None:
        """Try to connect now (bounded by ``mq_timeout``); on failure keep retrying in the
        background every ``heartbeat_interval``, so the engine serves (without LMCache)
        meanwhile."""
        if self._try_connect():
            return
        self._connect_thread = threading.Thread(target=self._connect_loop, daemon=True,
                                                name="lmcache-connect")
        self._connect_thread.start()

    def _try_connect(self) -> bool:
        try:
            self._connect()
        except Exception as exc:  # noqa: BLE001 - any failure means "retry later"
            self.connect_error = f"{type(exc).__name__}: {exc}"
            log.warning("LMCache at %s not reachable: %s", self.url, self.connect_error)
            return False
        self.connect_error = None
        log.info("connected to LMCache at %s (chunk size %s)", self.url, self.chunk_size)
        if self._on_state_change:
            self._on_state_change()
        return True

    def _connect_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            if self._try_connect():
                return

    def _connect(self) -> None:
        import zmq
        from lmcache.integration.vllm.vllm_multi_process_adapter import (
            LMCacheMPSchedulerAdapter,
            LMCacheMPWorkerAdapter,
            ParallelStrategy,
        )
        from lmcache.v1.multiprocess.group_view import EngineGroupInfo

        ctx = zmq.Context.instance()
        strategy = ParallelStrategy(mla_only=False, vllm_world_size=1, vllm_worker_id=0,
                                    tp_size=1, pp_size=1, n_servers=1)
        extra = {"lmcache.mp.mq_timeout": self.mq_timeout,
                 "lmcache.mp.heartbeat_interval": self.heartbeat_interval}
        scheduler = LMCacheMPSchedulerAdapter(
            [self.url], ctx, self.model_name, self.block_size, strategy, extra_config=extra)
        if scheduler.lmcache_tokens_per_chunk % self.prefill_segment:
            scheduler.shutdown()
            raise ValueError(
                f"LMCache chunk size {scheduler.lmcache_tokens_per_chunk} is not a multiple "
                f"of --prefill-segment {self.prefill_segment}; set --prefill-segment to a "
                "divisor of the server's --chunk-size")
        try:
            worker = LMCacheMPWorkerAdapter(
                self.url, ctx, self.model_name, self.block_size, strategy, extra_config=extra)
        except Exception:
            scheduler.shutdown()
            raise
        infos = [EngineGroupInfo(engine_group_id=0,
                                 layer_indices=tuple(range(len(self.pool.layers))),
                                 tokens_per_block=self.block_size)]
        try:
            worker.register_kv_caches(self.pool.as_named(), infos, {"kv_layout": "NHD"})
        except Exception:
            worker.shutdown()
            scheduler.shutdown()
            raise
        self.chunk_size = scheduler.lmcache_tokens_per_chunk
        self.worker = worker
        self.scheduler = scheduler

    @property
    def connected(self) -> bool:
        """True once the adapters exist (the server may still be unhealthy)."""
        return self.scheduler is not None and self.worker is not None

    @property
    def healthy(self) -> bool:
        """Connected and both adapters' last heartbeat succeeded."""
        return (self.connected and self.scheduler.is_healthy  # type: ignore[union-attr]
                and self.worker.is_healthy)  # type: ignore[union-attr]

    def state(self) -> str:
        """``healthy`` | ``unhealthy`` | ``connecting`` for /debug/state."""
        if not self.connected:
            return "connecting"
        return "healthy" if self.healthy else "unhealthy"

    # ---- lookup -----------------------------------------------------------------------
    def submit_lookup(self, request_id: str, token_ids: list[int], salt: str) -> bool:
        """Send LOOKUP for the prompt (the last token is reserved: it is always computed).

        Returns:
            False when no lookup was sent (not connected or unhealthy).
        """
        if not self.healthy:
            return False
        self.scheduler.maybe_submit_lookup_request(  # type: ignore[union-attr]
            request_id, token_ids, cache_salt=salt, reserve_last_token=True)
        self._lookup_started[request_id] = time.monotonic()
        self._attempt[request_id] = self._attempt.get(request_id, 0) + 1
        self.open_sessions.add(request_id)
        return True

    def poll_lookup(self, request_id: str) -> LookupOutcome:
        """Poll a submitted lookup without blocking.

        Returns:
            ``pending`` while the prefetch runs; otherwise the final outcome (``timeout``
            when the adapter or our own deadline gave up on the server).
        """
        started = self._lookup_started.get(request_id)
        if started is None:
            return LookupOutcome("error")
        try:
            result = self.scheduler.check_lookup_result(request_id)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - F5: never let a lookup error kill the engine
            log.warning("lookup %s failed: %s", request_id, exc)
            self._lookup_started.pop(request_id, None)
            return LookupOutcome("error")
        if result is None:
            if time.monotonic() - started > self.mq_timeout + 1.0:
                self._lookup_started.pop(request_id, None)
                return LookupOutcome("timeout")
            return LookupOutcome("pending")
        self._lookup_started.pop(request_id, None)
        if not self.scheduler.is_healthy:  # type: ignore[union-attr]
            return LookupOutcome("timeout")
        return LookupOutcome("hit" if result > 0 else "miss", int(result))

    def pending_lookups(self) -> list[str]:
        """Request ids whose lookup was sent and not yet resolved."""
        return sorted(self._lookup_started)

    def free_locks(self, request_id: str, token_ids: list[int], salt: str,
                   start: int, end: int) -> None:
        """Release lookup read locks on chunks ``[start, end)`` that will not be retrieved."""
        if end <= start:
            return

        def send() -> None:
            self.scheduler.free_lookup_locks(  # type: ignore[union-attr]
                token_ids, start, end, request_id, cache_salt=salt)

        self._send_or_defer(request_id, send)

    def end_request(self, request_id: str) -> None:
        """END_SESSION and forget the lookup (deferred while the server is unhealthy)."""
        self._lookup_started.pop(request_id, None)
        if request_id not in self.open_sessions:
            return

        attempt = self._attempt.get(request_id, 0)

        def send() -> None:
            if self._attempt.get(request_id, 0) != attempt:
                return  # a newer attempt owns the session now; its own end will end it
            self.scheduler.end_session(request_id)  # type: ignore[union-attr]
            self.scheduler.cleanup_lookup_result(request_id)  # type: ignore[union-attr]
            self.open_sessions.discard(request_id)
            self._attempt.pop(request_id, None)

        self._send_or_defer(request_id, send)

    def forget_lookup(self, request_id: str) -> None:
        """Drop the adapter's cached lookup result so that a resumed request looks up again."""
        if self.connected:
            self.scheduler.cleanup_lookup_result(request_id)  # type: ignore[union-attr]
        self._lookup_started.pop(request_id, None)

    def _send_or_defer(self, request_id: str, send: Callable[[], None]) -> None:
        if self.healthy:
            try:
                send()
                return
            except Exception as exc:  # noqa: BLE001
                log.warning("LMCache clean-up for %s failed, will retry: %s", request_id, exc)
        self._deferred.append((request_id, send))

    def flush_deferred(self) -> None:
        """Send the clean-ups kept while the server was unhealthy (call once per step)."""
        if not self._deferred or not self.healthy:
            return
        pending, self._deferred = self._deferred, []
        for request_id, send in pending:
            self._send_or_defer(request_id, send)

    # ---- worker: retrieve / store -----------------------------------------------------
    def retrieve(self, request_id: str, token_ids: list[int], salt: str, start: int,
                 end: int, block_ids: list[int], skip_first_n_tokens: int) -> bool:
        """Load chunks ``[start, end)`` into ``block_ids`` (the blocks of those positions).

        Returns:
            True only when LMCache reports the retrieve succeeded.
        """
        from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp

        if not self.connected:
            return False
        worker = self.worker
        op = LoadStoreOp(token_ids=list(token_ids), block_ids=[list(block_ids)], start=start,
                         end=end, skip_first_n_tokens=skip_first_n_tokens)
        try:
            worker.submit_retrieve_request(  # type: ignore[union-attr]
                request_id, op, None, cache_salt=salt)
            _, finished = worker.get_finished(set())  # type: ignore[union-attr]
            failed = worker.get_failed_request_ids()  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - a failed load is a miss, never a crash
            log.warning("retrieve %s failed: %s", request_id, exc)
            return False
        return bool(finished) and request_id in finished and request_id not in failed

    def store(self, request_id: str, token_ids: list[int], salt: str, start: int, end: int,
              block_ids: list[int]) -> bool:
        """Store full chunks ``[start, end)`` from ``block_ids`` (the blocks of those positions).

        Returns:
            True when the server accepted the store.
        """
        from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp

        if not self.healthy or end <= start:
            return False
        worker = self.worker
        op = LoadStoreOp(token_ids=list(token_ids), block_ids=[list(block_ids)], start=start,
                         end=end)
        self.open_sessions.add(request_id)
        try:
            worker.submit_store_request(  # type: ignore[union-attr]
                request_id, op, None, cache_salt=salt)
            fut = worker.store_futures.get(request_id)  # type: ignore[union-attr]
            ok = bool(fut is not None and fut.query() and fut.result(timeout=0))
            worker.get_finished({request_id})  # type: ignore[union-attr]
            return ok
        except Exception as exc:  # noqa: BLE001
            log.warning("store %s failed: %s", request_id, exc)
            return False

    def close(self) -> None:
        """Stop the connect loop and shut the adapters down (unregisters the KV caches)."""
        self._stop.set()
        for adapter in (self.worker, self.scheduler):
            if adapter is not None:
                try:
                    adapter.shutdown()
                except Exception:  # noqa: BLE001
                    pass
