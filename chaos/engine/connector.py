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

Replaying kept clean-ups must not invent state on a server that never saw the request: the
server's FREE_LOOKUP_LOCKS handler creates a session for any request id (lmcache
``LookupModule.free_lookup_locks``: ``session_manager.get_or_create``), and the adapter's
``end_session`` silently skips END_SESSION while a LOOKUP or status query of the request is
unanswered (it marks the server unhealthy instead). A LOOKUP still unanswered ``mq_timeout``
after the server answers pings again was either lost with the connection (a restarted server
never got it) or handled and its reply lost on the way back (a link that drops the server's
replies); QUERY_PREFETCH_STATUS tells which (:meth:`LMCacheConnector.lookup_known`: 0 for a
request the server does not know, and it creates no session). Lost: it holds no lock anywhere
we can reach, so its lock frees are dropped. Handled: the server holds its locks, the query
moved its result to the session, and its lock frees are sent. Either way the adapter's stale
futures are discarded and END_SESSION is sent (it never creates a session).

The same holds for a retrieve or store that timed out on the client (``mq_timeout``) while the
server was frozen or its link stalled: the server still has the message and handles it once it
runs again, on the worker's connection, which nothing orders with the scheduler's. Its handlers
(lmcache ``EngineDrivenTransferModule.prepare_retrieve`` / ``commit_retrieve`` /
``prepare_store`` / ``commit_store``) call ``session_manager.get_or_create``, so one handled
after END_SESSION makes a session nothing ends until the session reaper (600 s); and a late
PREPARE_RETRIEVE that succeeds releases the lookup's read locks itself (with the pickle
transport this engine's CPU transfers use: ``PickleTransferStrategy.prepare_retrieve`` calls
``finish_read_prefetched``), so a FREE of the same
chunks would release them twice (the server's read locks are anonymous counts: the second could
strip another reader's). The connector therefore records every transfer RPC's reply future per
request id (:meth:`LMCacheConnector.unanswered_transfer`); the request's FREE and END_SESSION
wait until those are answered, or for ``mq_timeout`` of health (then they were lost with the
connection and the clean-ups are sent as they are); a FREE whose chunks a late successful
PREPARE_RETRIEVE released is dropped.

A LOOKUP the adapter gave up on can still reach the server: one sent while the server was dead
waits in the message queue's pipe and is delivered to the restarted server when the connection
comes back, and one sent to a frozen server is handled when it runs again. The server then starts
a prefetch that read-locks the chunks it finds, while the adapter has already forgotten the
LOOKUP (its ack timeout drops the futures). A FREE_LOOKUP_LOCKS that reaches the server while that
prefetch still runs releases nothing (lmcache ``LookupModule.free_lookup_locks`` leaves the locks
to the prefetch controller, which keeps them: docs/findings/frozen-l2-read-lock-leak.md). So the
connector keeps each LOOKUP's reply futures itself until the lookup's outcome is known, and a
lock free of a lookup given up before the server acknowledged it waits for the LOOKUP's reply
(``mq_timeout`` of health, then the LOOKUP was lost: its frees are dropped) and then for
QUERY_PREFETCH_STATUS to return a count (``mq_timeout``, then the FREE is sent anyway). A lookup
the server had acknowledged when the engine's deadline gave up on it is freed at once, as a
production scheduler frees it: that FREE during a running prefetch is LMCache's own leak, which
the findings must reach.

The adapter's END_SESSION is fire-and-forget (it drops the reply future), so one written into a
connection that is then reset is lost and the server keeps the session until its reaper
(docs/findings/end-session-lost-on-reset.md). The connector keeps the reply futures of the
END_SESSIONs and PINGs the scheduler adapter's request clients send and counts an END_SESSION as
lost once a PING sent after it was answered while its own reply never came
(:meth:`LMCacheConnector.check_end_sessions`): the engine's evidence that the finding's window
was reached. It observes only; it resends nothing (that would hide the LMCache bug).
FREE_LOOKUP_LOCKS is fire-and-forget too (the adapter drops its reply future): the same rule
counts one lost with a cut or reset connection (:meth:`LMCacheConnector.check_lock_frees`), the
window of docs/findings/lock-free-lost-on-cut.md (the lookup's read locks then stay until
LMCache's L1 read-lock TTL).
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
        # Clean-ups kept while the server was unhealthy, in order: (request id, is a lock free,
        # send); ``send`` returns False when the adapter dropped the call (retry later).
        self._deferred: list[tuple[str, bool, Callable[[], bool]]] = []
        # Request id -> when a replay first found its LOOKUP (or status query) unanswered.
        self._replay_waiting: dict[str, float] = {}
        # Requests whose unanswered lookup was given up as lost: their lock frees are dropped.
        self._lost_lookups: set[str] = set()
        # Request id -> its transfer RPCs (retrieve and store) whose reply had not come when
        # last looked at: (operation, [start, end) of the key, reply future).
        self._transfers: dict[str, list[tuple[str, int, int, object]]] = {}
        # Request id -> [start, end) ranges whose read locks a (late) successful
        # PREPARE_RETRIEVE released on the server: a FREE inside one is not sent.
        self._released_by_retrieve: dict[str, list[tuple[int, int]]] = {}
        # Request id -> reply futures of its last LOOKUP (one per server) while the lookup's
        # outcome is unknown to the engine (kept after the adapter's ack timeout drops them).
        self._lookup_acks: dict[str, list[object]] = {}
        # Request id -> server url -> our QUERY_PREFETCH_STATUS future, or None once that
        # server reported the prefetch finished (:meth:`prefetch_running`).
        self._prefetch_queries: dict[str, dict[str, object | None]] = {}
        # Request id -> when a lock free first waited for the request's prefetch.
        self._prefetch_waiting: dict[str, float] = {}
        # Request id -> (when first asked, server url -> QUERY_PREFETCH_STATUS future) for a
        # LOOKUP that was never answered: does the server know it (:meth:`lookup_known`)?
        self._unanswered_probes: dict[str, tuple[float, dict[str, object]]] = {}
        # END_SESSIONs of sessions the server holds, sent and not yet answered: request id ->
        # (when sent, reply future, when a later PING was first seen answered or None).
        self._end_sessions: dict[str, tuple[float, object, float | None]] = {}
        # PINGs the adapter's heartbeat sent on the scheduler's connection: (when sent, future).
        self._pings: list[tuple[float, object]] = []
        # END_SESSIONs found lost (:meth:`check_end_sessions`), for the engine's counter.
        self.end_sessions_lost = 0
        # FREE_LOOKUP_LOCKS sent for sessions the server holds, not yet answered: (request id,
        # when sent) -> (reply future, when a later PING was first seen answered or None); a
        # list, since one request may free twice in one clock tick.
        self._lock_frees: list[tuple[str, float, object, float | None]] = []
        # FREE_LOOKUP_LOCKS found lost (:meth:`check_lock_frees`), for the engine's counter.
        self.lock_frees_lost = 0
        # When the latest PING seen answered was sent (:meth:`_latest_answered_ping`).
        self._latest_ping_answered: float | None = None
        self._transfers_lock = threading.Lock()
        self._stop = threading.Event()
        self._connect_thread: threading.Thread | None = None
        # Planted bug ``no-reconnect``: the connection was given up for good.
        self.abandoned = False

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
        self._track_transfers(worker.req_client)
        infos = [EngineGroupInfo(engine_group_id=0,
                                 layer_indices=tuple(range(len(self.pool.layers))),
                                 tokens_per_block=self.block_size)]
        try:
            worker.register_kv_caches(self.pool.as_named(), infos, {"kv_layout": "NHD"})
        except Exception:
            worker.shutdown()
            scheduler.shutdown()
            raise
        self._track_lookups(scheduler)
        self.chunk_size = scheduler.lmcache_tokens_per_chunk
        self.worker = worker
        self.scheduler = scheduler

    @property
    def connected(self) -> bool:
        """True once the adapters exist (the server may still be unhealthy)."""
        return self.scheduler is not None and self.worker is not None

    @property
    def heartbeats_running(self) -> int:
        """How many of the two adapters run their heartbeat (0, 1 or 2). LMCache 0.5.6 starts
        them lazily (``_ensure_heartbeat_started``): the scheduler adapter's with its first
        lookup, the worker adapter's with its first store or retrieve; until then nothing
        PINGs the server, so a restart of it is never seen (LMCache issue 4715). An adapter
        without that attribute (another LMCache version) counts as running."""
        if not self.connected:
            return 0
        return (int(getattr(self.scheduler, "_heartbeats", True) is not None)
                + int(getattr(self.worker, "_heartbeat", True) is not None))

    @property
    def healthy(self) -> bool:
        """Connected and both adapters' last heartbeat succeeded (never once abandoned)."""
        return (self.connected and not self.abandoned
                and self.scheduler.is_healthy  # type: ignore[union-attr]
                and self.worker.is_healthy)  # type: ignore[union-attr]

    def abandon(self) -> None:
        """Planted bug ``no-reconnect`` (F11): give the connection up for good.

        From now on nothing is sent to LMCache (no lookup, retrieve, store or clean-up) and
        nothing of it is remembered (kept clean-ups and open sessions are forgotten), as a
        client that dropped its connection object and never made a new one.
        """
        if self.abandoned:
            return
        self.abandoned = True
        self._deferred.clear()
        self._replay_waiting.clear()
        self.open_sessions.clear()
        with self._transfers_lock:
            self._transfers.clear()
            self._released_by_retrieve.clear()
            self._lookup_acks.clear()
            self._prefetch_queries.clear()
            self._prefetch_waiting.clear()
            self._unanswered_probes.clear()
            self._end_sessions.clear()
            self._lock_frees.clear()
            self._pings.clear()
            self._latest_ping_answered = None
        self._lookup_started.clear()
        log.warning("planted bug no-reconnect: LMCache at %s abandoned for good", self.url)

    def repoll_timed_out_lookup(self, request_id: str) -> int:
        """Planted bug ``repoll-timed-out-lookup`` (F5, LMCache PR 3766): poll a timed-out
        lookup again, the way the pre-fix code did.

        The timeout handling drops the adapter's state for the request; reading its result
        table by request id afterwards raises the ``KeyError`` that killed the worker.

        Raises:
            KeyError: always, once the timeout dropped the request's lookup state.
        """
        self.scheduler.cleanup_lookup_result(request_id)  # type: ignore[union-attr]
        return self.scheduler._finished_lookup_results[request_id]  # type: ignore[union-attr]

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
        self._forget_lookup_tracking(request_id)  # an earlier attempt's LOOKUP is settled
        self.scheduler.maybe_submit_lookup_request(  # type: ignore[union-attr]
            request_id, token_ids, cache_salt=salt, reserve_last_token=True)
        self._lookup_started[request_id] = time.monotonic()
        self._attempt[request_id] = self._attempt.get(request_id, 0) + 1
        self._lost_lookups.discard(request_id)
        self.open_sessions.add(request_id)
        with self._transfers_lock:  # a new lookup locks again: earlier releases do not count
            self._released_by_retrieve.pop(request_id, None)
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
                self._give_up_lookup(request_id)
                return LookupOutcome("timeout")
            return LookupOutcome("pending")
        self._lookup_started.pop(request_id, None)
        if not self.scheduler.is_healthy:  # type: ignore[union-attr]
            self._give_up_lookup(request_id)
            return LookupOutcome("timeout")
        self._forget_lookup_tracking(request_id)  # the adapter consumed the prefetch result
        return LookupOutcome("hit" if result > 0 else "miss", int(result))

    def pending_lookups(self) -> list[str]:
        """Request ids whose lookup was sent and not yet resolved."""
        return sorted(self._lookup_started)

    def free_locks(self, request_id: str, token_ids: list[int], salt: str,
                   start: int, end: int) -> None:
        """Release lookup read locks on chunks ``[start, end)`` that will not be retrieved."""
        if end <= start:
            return

        def send() -> bool:
            # The adapter drops the call only when unhealthy at entry; once past that check
            # the FREE is on the wire, and it must never be sent twice (the server's L1 read
            # locks are anonymous counts: a second release could strip another reader's).
            if not self.scheduler.is_healthy:  # type: ignore[union-attr]
                return False
            if self.unanswered_transfer(request_id):
                return False  # a late retrieve may release these locks itself: wait for it
            if self.lookup_ack_pending(request_id) or self.prefetch_running(request_id):
                return False  # a FREE while the lookup's prefetch runs releases nothing
            if self.released_by_retrieve(request_id, start, end):
                log.warning("LMCache's late reply to the retrieve of %s released chunks "
                            "[%d, %d) itself: their lock free is not sent", request_id, start, end)
                return True
            self.scheduler.free_lookup_locks(  # type: ignore[union-attr]
                token_ids, start, end, request_id, cache_salt=salt)
            return True

        self._send_or_defer(request_id, True, send)

    def end_request(self, request_id: str) -> None:
        """END_SESSION and forget the lookup (deferred while the server is unhealthy)."""
        self._lookup_started.pop(request_id, None)
        if request_id not in self.open_sessions:
            return

        attempt = self._attempt.get(request_id, 0)

        def send() -> bool:
            if self._attempt.get(request_id, 0) != attempt:
                return True  # a newer attempt owns the session now; its own end will end it
            scheduler = self.scheduler
            if not scheduler.is_healthy:  # type: ignore[union-attr]
                return False
            if self.unanswered_transfer(request_id):
                return False  # the server would make the session again when it handles it
            scheduler.end_session(request_id)  # type: ignore[union-attr]
            if not scheduler.is_healthy:  # type: ignore[union-attr]
                # The adapter gave up waiting for this request's LOOKUP or status reply and
                # skipped END_SESSION (it marks the server unhealthy when it does): retry.
                return False
            scheduler.cleanup_lookup_result(request_id)  # type: ignore[union-attr]
            self.open_sessions.discard(request_id)
            self._attempt.pop(request_id, None)
            self._lost_lookups.discard(request_id)
            with self._transfers_lock:
                self._released_by_retrieve.pop(request_id, None)
            self._forget_lookup_tracking(request_id)
            return True

        self._send_or_defer(request_id, False, send)

    def forget_lookup(self, request_id: str) -> None:
        """Drop the adapter's cached lookup result so that a resumed request looks up again."""
        if self.connected:
            self.scheduler.cleanup_lookup_result(request_id)  # type: ignore[union-attr]
        self._lookup_started.pop(request_id, None)

    def _send_or_defer(self, request_id: str, is_free: bool, send: Callable[[], bool]) -> None:
        if self.abandoned:
            return
        if self.healthy and not self._deferred_for(request_id):
            try:
                if send():
                    return
            except Exception as exc:  # noqa: BLE001
                log.warning("LMCache clean-up for %s failed, will retry: %s", request_id, exc)
        self._deferred.append((request_id, is_free, send))

    def _deferred_for(self, request_id: str) -> bool:
        """True while earlier clean-ups of ``request_id`` are kept (keep them in order)."""
        return any(rid == request_id for rid, _, _ in self._deferred)

    def unanswered_lookup(self, request_id: str) -> bool:
        """True while the adapter waits for a reply to the request's LOOKUP or status query.

        Reads the adapter's bookkeeping (``_unacked_lookups``, ``_lookup_status``): its
        ``end_session`` skips END_SESSION while either is unanswered, and it has no public
        accessor for them.
        """
        scheduler = self.scheduler
        if scheduler is None:
            return False
        ack = getattr(scheduler, "_unacked_lookups", {}).get(request_id)
        if ack is not None and any(not f.query() for f in ack.futures.values()):
            return True
        status = getattr(scheduler, "_lookup_status", {}).get(request_id, {})
        return any(not fut.query() for fut, _ in status.values())

    # ---- LOOKUPs whose prefetch the server may still run ---------------------------------
    def _track_lookups(self, scheduler: object) -> None:
        """Record the reply futures of every LOOKUP the scheduler adapter sends.

        Wraps ``lookup`` of each of the adapter's request clients (``req_clients``, server url
        -> lmcache ``RequestClient``: ``lookup(key, tp_size)`` returns a ``MessagingFuture``)
        on the instance. The adapter drops a LOOKUP's futures when its ack timeout gives up
        (``check_lookup_result``); the message queue client still completes them when the
        server handles that LOOKUP late.
        """
        for client in getattr(scheduler, "req_clients", {}).values():
            if getattr(client, "_kvchaos_lookups_tracked", False):
                continue
            original = getattr(client, "lookup", None)
            if original is None:
                continue

            def wrapped(key, *args, _original=original, **kwargs):
                future = _original(key, *args, **kwargs)
                request_id = getattr(key, "request_id", None)
                if request_id is not None:
                    with self._transfers_lock:
                        self._lookup_acks.setdefault(request_id, []).append(future)
                return future

            client.lookup = wrapped
            self._track_end_sessions(client)
            client._kvchaos_lookups_tracked = True

    # ---- END_SESSIONs lost with their connection ------------------------------------------
    def _track_end_sessions(self, client: object) -> None:
        """Record the reply futures of the END_SESSIONs and PINGs sent on ``client``.

        ``client`` is one of the scheduler adapter's request clients (lmcache
        ``RequestClient``: ``end_session(request_id)`` and ``ping(instance_id)`` return a
        ``MessagingFuture``). The adapter drops END_SESSION's future
        (``LMCacheMPSchedulerAdapter.end_session``); its heartbeat PINGs go over the same client,
        so the same ZeroMQ socket and its message pipe, in order
        (:meth:`check_end_sessions` relies on it). An END_SESSION is recorded only when the
        server holds the request's session (its LOOKUP was answered and not given up as lost).
        """
        end_session = getattr(client, "end_session", None)
        ping = getattr(client, "ping", None)
        free = getattr(client, "free_lookup_locks", None)
        if end_session is None or ping is None:
            return

        def wrapped_end_session(request_id, *args, _original=end_session, **kwargs):
            sent = time.monotonic()
            future = _original(request_id, *args, **kwargs)
            if request_id not in self._lost_lookups and not self.lookup_ack_pending(request_id):
                with self._transfers_lock:
                    self._end_sessions[request_id] = (sent, future, None)
            return future

        def wrapped_ping(*args, _original=ping, **kwargs):
            sent = time.monotonic()
            future = _original(*args, **kwargs)
            with self._transfers_lock:
                self._pings.append((sent, future))
            return future

        def wrapped_free(key, *args, _original=free, **kwargs):
            sent = time.monotonic()
            future = _original(key, *args, **kwargs)
            request_id = getattr(key, "request_id", None)
            if request_id is not None and request_id not in self._lost_lookups:
                with self._transfers_lock:
                    self._lock_frees.append((request_id, sent, future, None))
            return future

        client.end_session = wrapped_end_session
        client.ping = wrapped_ping
        if free is not None:
            client.free_lookup_locks = wrapped_free

    def check_end_sessions(self) -> int:
        """Find the END_SESSIONs lost with their connection (call once per step).

        An END_SESSION is lost when a PING the heartbeat sent after it on the same request
        client was answered while END_SESSION's own reply had not come, and it still has not
        come ``mq_timeout`` later. The two share one ZeroMQ DEALER socket, whose pipe delivers
        in order and keeps what it has not yet written while the connection is down: a later
        PING that reached the server means END_SESSION was no longer waiting in the pipe, so it
        was written into a connection and either never reached the server (lost with a reset
        connection: the server keeps the session until its reaper, 600 s) or the server handled
        it and its reply was lost on the way back. Logs a warning per lost END_SESSION:
        ``END_SESSION for request_id=R was lost: ...``.

        Returns:
            how many END_SESSIONs this call found lost (also added to
            :attr:`end_sessions_lost`).
        """
        now = time.monotonic()
        with self._transfers_lock:
            latest_ping = self._latest_answered_ping()
            # An unanswered PING older than two timeouts was lost: nothing waits for it.
            self._pings = [(sent, future) for sent, future in self._pings
                           if not future.query() and now - sent < 2 * self.mq_timeout]  # type: ignore[attr-defined]
            lost = []
            for request_id, (sent, future, overtaken) in list(self._end_sessions.items()):
                state, overtaken = self._overtaken(sent, future, overtaken, latest_ping, now)
                if state == "waiting":
                    self._end_sessions[request_id] = (sent, future, overtaken)
                    continue
                del self._end_sessions[request_id]
                if state == "lost":
                    lost.append((request_id, now - sent))
        for request_id, age in lost:
            log.warning("END_SESSION for request_id=%s was lost: no reply %.1f s after it was "
                        "sent, while a later PING on the same connection was answered (LMCache "
                        "keeps the session until its reaper)", request_id, age)
        self.end_sessions_lost += len(lost)
        return len(lost)

    def _latest_answered_ping(self) -> float | None:
        """When the latest answered PING was sent (kept across :meth:`check_end_sessions`'s
        pruning of :attr:`_pings`); call under ``_transfers_lock``."""
        answered = [sent for sent, future in self._pings if future.query()]  # type: ignore[attr-defined]
        if answered:
            latest = max(answered)
            if self._latest_ping_answered is None or latest > self._latest_ping_answered:
                self._latest_ping_answered = latest
        return self._latest_ping_answered

    def _overtaken(self, sent: float, future: object, overtaken: float | None,
                   latest_ping: float | None, now: float) -> tuple[str, float | None]:
        """The state of one fire-and-forget message sent at ``sent`` (monotonic s):
        ``answered`` (its reply came), ``lost`` (a PING sent after it was answered, first seen
        at ``overtaken``, ``mq_timeout`` ago, and still no reply) or ``waiting``; with the
        updated ``overtaken``."""
        if future.query():  # type: ignore[attr-defined]
            return "answered", overtaken
        if overtaken is None:
            if latest_ping is not None and latest_ping > sent:
                return "waiting", now
            return "waiting", None
        if now - overtaken >= self.mq_timeout:
            return "lost", overtaken
        return "waiting", overtaken

    def check_lock_frees(self) -> int:
        """Find the FREE_LOOKUP_LOCKS lost with their connection (call once per step).

        The same rule as :meth:`check_end_sessions`: the adapter's ``free_lookup_locks`` drops
        the reply future (lmcache ``LMCacheMPSchedulerAdapter.free_lookup_locks``), and the
        heartbeat's PINGs share its request client's socket and pipe; a FREE whose reply never
        came while a PING sent after it was answered, ``mq_timeout`` later still unanswered,
        was written into a connection that closed under it (a Toxiproxy ``limit_data`` cut
        after its byte count, a reset) and never reached the server, or was handled and its
        reply lost. When it never reached the server, the read locks it was sent to release
        stay held until LMCache's L1 read-lock TTL (docs/findings/lock-free-lost-on-cut.md).
        Logs a warning per lost FREE: ``FREE_LOOKUP_LOCKS for request_id=R was lost: ...``.

        Returns:
            how many FREE_LOOKUP_LOCKS this call found lost (also added to
            :attr:`lock_frees_lost`).
        """
        now = time.monotonic()
        with self._transfers_lock:
            latest_ping = self._latest_answered_ping()
            lost, waiting = [], []
            for request_id, sent, future, overtaken in self._lock_frees:
                state, overtaken = self._overtaken(sent, future, overtaken, latest_ping, now)
                if state == "waiting":
                    waiting.append((request_id, sent, future, overtaken))
                elif state == "lost":
                    lost.append((request_id, now - sent))
            self._lock_frees = waiting
        for request_id, age in lost:
            log.warning("FREE_LOOKUP_LOCKS for request_id=%s was lost: no reply %.1f s after it was "
                        "sent, while a later PING on the same connection was answered (LMCache "
                        "keeps the read locks it was to release until their TTL)", request_id, age)
        self.lock_frees_lost += len(lost)
        return len(lost)

    def _give_up_lookup(self, request_id: str) -> None:
        """The engine gives up on the lookup of ``request_id`` (its outcome is ``timeout``).

        A LOOKUP every server had acknowledged by then is a prefetch the engine abandons
        knowingly, as a production scheduler does when its deadline passes: its tracking is
        dropped, so its lock free goes out at once (and LMCache leaves the locks to the running
        prefetch: the window of docs/findings/frozen-l2-read-lock-leak.md, which a wait here
        would close). A LOOKUP still unacknowledged stays tracked: the engine cannot know
        whether the server will ever handle it, and when it does (late, or on a restarted
        server) its lock free waits for that prefetch (:meth:`flush_deferred`).
        """
        if not self.lookup_ack_pending(request_id):
            self._forget_lookup_tracking(request_id)

    def lookup_ack_pending(self, request_id: str) -> bool:
        """True while a LOOKUP of ``request_id`` whose outcome the engine does not know has
        had no reply from some server (the adapter may have given up on it already)."""
        with self._transfers_lock:
            acks = list(self._lookup_acks.get(request_id, ()))
        return any(not f.query() for f in acks)  # type: ignore[attr-defined]

    def prefetch_running(self, request_id: str) -> bool:
        """True while a server still runs the prefetch of a LOOKUP of ``request_id`` whose
        outcome the engine does not know (non-blocking; call once per step).

        Only once every server acknowledged the LOOKUP (a status query may overtake it: the
        server answers 0 for a job it does not know yet), this sends QUERY_PREFETCH_STATUS to
        each server and keeps asking until each answers a count (lmcache
        ``LookupModule.query_prefetch_status``: None while the prefetch runs; a count moves the
        result to the session, so a later FREE releases exactly what the prefetch locked).
        When all have answered, the lookup's tracking is dropped and this returns False.
        """
        with self._transfers_lock:
            acks = list(self._lookup_acks.get(request_id, ()))
        if not acks or any(not f.query() for f in acks):  # type: ignore[attr-defined]
            return False  # nothing to settle, or the ack is awaited (lookup_ack_pending)
        clients = getattr(self.scheduler, "req_clients", {})
        with self._transfers_lock:
            queries = self._prefetch_queries.setdefault(request_id, {})
        for url, client in clients.items():
            if url in queries and queries[url] is None:
                continue  # this server's prefetch has finished
            future = queries.get(url)
            if future is not None:
                if not future.query():  # type: ignore[attr-defined]
                    continue
                try:
                    reply = future.result(timeout=0)  # type: ignore[attr-defined]
                except Exception:  # noqa: BLE001 - a failed query says nothing: ask again
                    reply = None
                if reply is not None:
                    queries[url] = None
                    continue
            queries[url] = client.query_prefetch_status(request_id)
        if all(queries.get(url, 0) is None for url in clients):
            self._forget_lookup_tracking(request_id)
            return False
        return True

    def _forget_lookup_tracking(self, request_id: str) -> None:
        with self._transfers_lock:
            self._lookup_acks.pop(request_id, None)
            self._prefetch_queries.pop(request_id, None)
            self._prefetch_waiting.pop(request_id, None)
            self._unanswered_probes.pop(request_id, None)

    def lookup_known(self, request_id: str) -> bool | None:
        """Whether a server handled the LOOKUP of ``request_id`` whose reply never came
        (non-blocking; call once per step, while the server is healthy).

        A LOOKUP can reach the server and its reply be lost on the way back (a link that drops
        or cuts the server's replies: the toxiproxy ``timeout`` or ``reset_peer`` toxic on the
        downstream stream); the server then runs the prefetch and read-locks the chunks it
        found, exactly as for an answered one. So before its lock frees are dropped as those
        of a LOOKUP lost with the connection, each server is asked with QUERY_PREFETCH_STATUS
        (lmcache ``LookupModule.query_prefetch_status``: None while the prefetch runs, its
        chunk count once done, and the count moves the result to the session so that a later
        FREE_LOOKUP_LOCKS releases exactly what it locked; 0 for a request id it does not
        know). It creates no session for an unknown id.

        Returns:
            None while a reply is awaited (a query unanswered ``mq_timeout`` after it was first
            sent counts as 0); True when some server answered a count above 0, or still ran
            the prefetch ``mq_timeout`` after the first query (its FREE then releases nothing,
            as for any abandoned prefetch: LMCache's own leak); False when every server
            answered 0 (it never got the LOOKUP, or it locked nothing).
        """
        clients = getattr(self.scheduler, "req_clients", {})
        now = time.monotonic()
        with self._transfers_lock:
            first, futures = self._unanswered_probes.setdefault(request_id, (now, {}))
        late = now - first >= self.mq_timeout
        known, waiting = False, False
        for url, client in clients.items():
            future = futures.get(url)
            if future is None:
                futures[url] = client.query_prefetch_status(request_id)
                waiting = True
                continue
            if not future.query():  # type: ignore[attr-defined]
                waiting = waiting or not late
                continue
            try:
                reply = future.result(timeout=0)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - a failed query says nothing: ask again
                futures[url] = client.query_prefetch_status(request_id)
                waiting = waiting or not late
                continue
            if reply is None:  # the server runs the prefetch: it has the LOOKUP
                if late:
                    known = True
                else:
                    futures[url] = client.query_prefetch_status(request_id)
                    waiting = True
            elif reply > 0:
                known = True
        if known:
            return True
        return None if waiting else False

    # ---- transfer RPCs the server may still handle --------------------------------------
    TRACKED_TRANSFERS = ("prepare_retrieve", "commit_retrieve", "prepare_store", "commit_store")

    def _track_transfers(self, client: object) -> None:
        """Record the reply future of every transfer RPC the worker adapter sends.

        Wraps ``client``'s :attr:`TRACKED_TRANSFERS` methods (lmcache ``RequestClient``: each
        takes the ``IPCCacheServerKey`` first and returns a ``MessagingFuture``) on the
        instance, so the adapter's transfer contexts, which hold the same client, go through
        the wrappers. The adapter drops a future its ``mq_timeout`` gave up on; the message
        queue client still completes it when the late reply comes.
        """
        if getattr(client, "_kvchaos_tracked", False):
            return
        for op in self.TRACKED_TRANSFERS:
            original = getattr(client, op, None)
            if original is None:
                continue

            def wrapped(key, *args, _original=original, _op=op, **kwargs):
                future = _original(key, *args, **kwargs)
                self._note_transfer(_op, key, future)
                return future

            setattr(client, op, wrapped)
        client._kvchaos_tracked = True  # type: ignore[attr-defined]

    def _note_transfer(self, op: str, key: object, future: object) -> None:
        request_id = getattr(key, "request_id", None)
        if request_id is None:
            return
        row = (op, int(getattr(key, "start", 0)), int(getattr(key, "end", 0)), future)
        with self._transfers_lock:
            self._transfers.setdefault(request_id, []).append(row)

    def unanswered_transfer(self, request_id: str) -> bool:
        """True while a retrieve or store RPC of ``request_id`` has had no reply.

        Replies that came are settled here: a PREPARE_RETRIEVE answered ``success`` marks its
        ``[start, end)`` as released by the server (:meth:`released_by_retrieve`).
        """
        with self._transfers_lock:
            rows = self._transfers.get(request_id)
            if not rows:
                return False
            waiting = []
            for op, start, end, future in rows:
                if not future.query():  # type: ignore[attr-defined]
                    waiting.append((op, start, end, future))
                    continue
                if op == "prepare_retrieve":
                    try:
                        reply = future.result(timeout=0)  # type: ignore[attr-defined]
                    except Exception:  # noqa: BLE001 - a failed reply released nothing
                        reply = None
                    if getattr(reply, "success", False):
                        self._released_by_retrieve.setdefault(request_id, []).append((start, end))
            if waiting:
                self._transfers[request_id] = waiting
            else:
                del self._transfers[request_id]
            return bool(waiting)

    def released_by_retrieve(self, request_id: str, start: int, end: int) -> bool:
        """True when a successful PREPARE_RETRIEVE of ``request_id`` covered ``[start, end)``
        (the server released those chunks' lookup read locks when it handled it)."""
        with self._transfers_lock:
            return any(s <= start and end <= e
                       for s, e in self._released_by_retrieve.get(request_id, ()))

    def forget_transfers(self, request_id: str) -> None:
        """Give up waiting for ``request_id``'s unanswered transfer RPCs (lost with the
        connection)."""
        with self._transfers_lock:
            self._transfers.pop(request_id, None)

    def flush_deferred(self) -> None:
        """Send the clean-ups kept while the server was unhealthy (call once per step).

        A request whose LOOKUP (or status query) is still unanswered waits up to
        ``mq_timeout`` of health for the reply (a stalled link delivers it late, and then the
        server does hold the locks); after that the message was lost with the connection:
        its lock frees are dropped (nothing of it is locked on this server, and FREE would
        create a session here), the adapter's stale futures are discarded and END_SESSION is
        sent. A request with a transfer RPC still unanswered (:meth:`unanswered_transfer`)
        waits the same way; when the reply never comes its clean-ups are sent as they are (the
        server never handled it, so the lookup's locks are still held). A lock free of a
        lookup whose LOOKUP the server did answer, late, waits until the server's prefetch for
        it has finished (:meth:`prefetch_running`), up to ``mq_timeout``; after that it is
        sent anyway.
        """
        if not self._deferred or not self.healthy:
            return
        pending, self._deferred = self._deferred, []
        now = time.monotonic()
        for request_id, is_free, send in pending:
            if self._deferred_for(request_id):
                self._deferred.append((request_id, is_free, send))  # keep the order
                continue
            if self.unanswered_transfer(request_id):
                since = self._replay_waiting.setdefault(request_id, now)
                if since + self.mq_timeout > now:  # a late retrieve or store reply may still come
                    self._deferred.append((request_id, is_free, send))
                    continue
                log.warning("LMCache never answered a retrieve or store of %s: it was lost with "
                            "the connection; sending its clean-ups", request_id)
                self.forget_transfers(request_id)
                self._replay_waiting.pop(request_id, None)
            if request_id not in self._lost_lookups and (self.unanswered_lookup(request_id)
                                                         or self.lookup_ack_pending(request_id)):
                since = self._replay_waiting.setdefault(request_id, now)
                if now - since < self.mq_timeout:
                    self._deferred.append((request_id, is_free, send))
                    continue
                known = self.lookup_known(request_id)
                if known is None:  # the server is being asked whether it got the LOOKUP
                    self._deferred.append((request_id, is_free, send))
                    continue
                if known:
                    log.warning("LMCache never answered the lookup of %s, but it handled it "
                                "(QUERY_PREFETCH_STATUS): its reply was lost on the way back; "
                                "sending its clean-ups", request_id)
                else:
                    log.warning("LMCache never answered the lookup of %s: it was lost with the "
                                "connection; dropping its lock frees", request_id)
                    self._lost_lookups.add(request_id)
                self._forget_lookup_tracking(request_id)
                self.scheduler.cleanup_lookup_result(request_id)  # type: ignore[union-attr]
            self._replay_waiting.pop(request_id, None)
            if is_free and request_id not in self._lost_lookups and self.prefetch_running(request_id):
                with self._transfers_lock:
                    began = self._prefetch_waiting.setdefault(request_id, now)
                if now - began < self.mq_timeout:  # a FREE now would release nothing
                    self._deferred.append((request_id, is_free, send))
                    continue
                log.warning("LMCache's prefetch for the lookup of %s still runs %.1f s after its "
                            "outcome was given up: sending its lock free anyway (LMCache leaves "
                            "a running prefetch's locks to it)", request_id, now - began)
                self._forget_lookup_tracking(request_id)
            if is_free and request_id in self._lost_lookups:
                continue
            self._send_or_defer(request_id, is_free, send)

    # ---- raw adapter calls (fault hook ``POST /hooks/lmcache``) -------------------------
    RAW_CALLS = ("free_lookup_locks", "lookup_then_end_session")

    @staticmethod
    def raw_prompt(request_id: str, tokens: int) -> list[int]:
        """``tokens`` token ids (0..255) derived from ``request_id``: the same ids for the same
        id, and (with overwhelming probability) no prefix any workload stored."""
        import hashlib
        import random

        rng = random.Random(hashlib.blake2b(request_id.encode(), digest_size=8).digest())
        return [rng.randrange(256) for _ in range(tokens)]

    def raw_call(self, call: str, request_id: str, tokens: int) -> dict:
        """Make one call of LMCache's scheduler adapter exactly as a client would, with none of
        this connector's bookkeeping or workarounds (no deferral, no retry, no state kept):
        the reproducers of docs/findings/ use it to reach LMCache's own behaviour.

        Args:
            call: ``free_lookup_locks`` (FREE_LOOKUP_LOCKS of ``[0, tokens)`` rounded down to
                whole chunks, for a request the server never looked up) or
                ``lookup_then_end_session`` (LOOKUP, then ``end_session`` at once; the
                adapter's bookkeeping of the request is cleaned up afterwards).
            request_id: the request id sent to LMCache.
            tokens: prompt length in tokens (:meth:`raw_prompt`); at least one chunk.

        Returns:
            What the adapter did, as far as it tells: ``adapter_healthy_before`` (a call made
            while unhealthy is dropped by the adapter without a word),
            ``adapter_healthy_after``, and for ``lookup_then_end_session``
            ``end_session_returned_after_s`` (seconds ``end_session`` took).

        Raises:
            ValueError: unknown ``call``, or ``tokens`` shorter than one chunk.
            RuntimeError: not connected to LMCache.
        """
        if call not in self.RAW_CALLS:
            raise ValueError(f"unknown call {call!r}; known: {', '.join(self.RAW_CALLS)}")
        scheduler = self.scheduler
        if scheduler is None or self.chunk_size is None:
            raise RuntimeError("not connected to LMCache")
        end = (tokens // self.chunk_size) * self.chunk_size
        if end == 0:
            raise ValueError(f"tokens must cover at least one chunk ({self.chunk_size} tokens)")
        prompt = self.raw_prompt(request_id, tokens)
        out: dict = {"call": call, "request_id": request_id, "tokens": tokens,
                     "adapter_healthy_before": scheduler.is_healthy}
        if call == "free_lookup_locks":
            scheduler.free_lookup_locks(prompt, 0, end, request_id)
        else:
            scheduler.maybe_submit_lookup_request(request_id, prompt, reserve_last_token=True)
            t0 = time.monotonic()
            scheduler.end_session(request_id)
            out["end_session_returned_after_s"] = round(time.monotonic() - t0, 3)
            scheduler.cleanup_lookup_result(request_id)
            self._forget_lookup_tracking(request_id)  # none of this connector's bookkeeping
        out["adapter_healthy_after"] = scheduler.is_healthy
        log.warning("hook: raw LMCache call %s", out)
        return out

    # ---- worker: retrieve / store -----------------------------------------------------
    def retrieve(self, request_id: str, token_ids: list[int], salt: str, start: int,
                 end: int, block_ids: list[int], skip_first_n_tokens: int) -> bool:
        """Load chunks ``[start, end)`` into ``block_ids`` (the blocks of those positions).

        Returns:
            True only when LMCache reports the retrieve succeeded.
        """
        from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp

        if not self.connected or self.abandoned:
            return False
        worker = self.worker
        op = LoadStoreOp(token_ids=list(token_ids), block_ids=[list(block_ids)], start=start,
                         end=end, skip_first_n_tokens=skip_first_n_tokens)
        # The adapter drops a retrieve handed to it while unhealthy without sending it: the
        # server never sees it, so the lookup's read locks stay held until freed.
        dropped = not worker.is_healthy  # type: ignore[union-attr]
        try:
            worker.submit_retrieve_request(  # type: ignore[union-attr]
                request_id, op, None, cache_salt=salt)
            _, finished = worker.get_finished(set())  # type: ignore[union-attr]
            failed = worker.get_failed_request_ids()  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - a failed load is a miss, never a crash
            log.warning("retrieve %s failed: %s", request_id, exc)
            return False
        finally:
            self.unanswered_transfer(request_id)  # settle the replies that came in time
        if dropped:
            log.warning("retrieve %s dropped by the adapter (LMCache unhealthy); the server "
                        "still holds its lookup locks", request_id)
            return False
        ok = bool(finished) and request_id in finished and request_id not in failed
        if not ok:
            log.warning("retrieve %s failed: LMCache reported it failed or unfinished", request_id)
        return ok

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
        finally:
            self.unanswered_transfer(request_id)  # settle the replies that came in time

    def close(self) -> None:
        """Stop the connect loop and shut the adapters down (unregisters the KV caches)."""
        self._stop.set()
        for adapter in (self.worker, self.scheduler):
            if adapter is not None:
                try:
                    adapter.shutdown()
                except Exception:  # noqa: BLE001
                    pass
