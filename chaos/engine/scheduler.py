"""EngineCore: the step scheduler (continuous batching, recompute-style preemption).

One thread runs ``step()`` in a loop. A step:

1. handles aborts (frees blocks, LMCache lookup locks and session) and hook requests;
2. admits waiting requests in arrival order: LMCache lookup (polled, never blocking) →
   local prefix-cache match → block allocation for the prompt → retrieve the chunks LMCache
   holds beyond the local hit (failure → ``kv_load_failure_policy``);
3. gives every running request one unit of work: one canonical prefill segment, or one
   decode token (a resumed request first replays its earlier output one token at a time);
   when a decode step finds no free block, the newest running request is preempted
   (vLLM V1: free its blocks, requeue it at the head, recompute on resume, look it up in
   LMCache again);
4. stores a request's full prompt chunks once its prefill is done; finishes requests.

Requests are batched per step but computed one by one: a fused GEMM over several requests
would round differently from the recompute twin's (see ``model.py``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import threading
import time
from typing import Any

import torch

from chaos import __version__
from chaos.engine.block_manager import BlockManager, block_hashes
from chaos.engine.bugs import validate_bugs
from chaos.engine.config import EngineConfig
from chaos.engine.connector import LMCacheConnector
from chaos.engine.kv_pool import KVPool
from chaos.engine.metrics import Metrics
from chaos.engine.model import PagedLlama
from chaos.engine.request import STAGES, Phase, Request, TokenEvent
from chaos.engine.tokenizer import EOS_ID

log = logging.getLogger("kvchaos.engine.scheduler")

STALL_POINTS = ("before_lookup", "before_retrieve", "before_store")
ENDED_KEPT = 4096  # ended requests whose last stage and abort record /debug/requests keeps


class RequestRejected(ValueError):
    """The request can never run on this engine (e.g. it needs more KV than the pool)."""


class EngineCore:
    """Owns the model, the KV pool, the block manager and the LMCache connector."""

    def __init__(self, config: EngineConfig) -> None:
        """Build the model and pool; connect to LMCache in the background.

        Args:
            config: validated engine settings.

        Raises:
            ValueError: invalid settings.
        """
        config.validate()
        self.config = config
        torch.set_num_threads(config.threads)
        self.model = PagedLlama(config.model)
        if config.numerics == "batch-dependent":
            self.model.batch_noise = config.batch_noise
        spec = config.model
        self.pool = KVPool(spec.num_layers, config.num_blocks, config.block_size,
                           spec.num_kv_heads, spec.head_size, spec.torch_dtype)
        self.blocks = BlockManager(config.num_blocks, config.block_size,
                                   config.enable_prefix_caching)
        self.fingerprint = config.fingerprint
        self.bugs = set(config.bugs)
        self.metrics = Metrics(config.served_model_name)
        self.connector: LMCacheConnector | None = None
        if config.kv_connector == "lmcache-mp":
            self.connector = LMCacheConnector(
                config.lmcache_url, f"{config.served_model_name}-{self.fingerprint}",
                config.block_size, self.pool, config.lmcache_mq_timeout,
                config.lmcache_heartbeat_interval, config.prefill_segment,
                on_state_change=self.wake)
        self.requests: dict[str, Request] = {}
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self._aborting: list[Request] = []
        self._inbox: list[Request] = []
        self._abort_ids: set[str] = set()
        self._hooks: list[tuple[str, Any, concurrent.futures.Future]] = []
        self._stalls: dict[str, list[float]] = {p: [] for p in STALL_POINTS}
        # Stage watchers (the HTTP layer's /debug/requests long-poll) and ended requests.
        self._stage_lock = threading.Lock()
        self._stage_waiters: dict[str, list[tuple[str, Any]]] = {}
        self._ended: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._abort_arrivals: dict[str, str] = {}
        self._inbox_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started_at = time.time()
        #: Blocks the planted ``hold-blocks-on-abort`` bug never freed.
        self.held_blocks = 0
        # ``/debug/kv``: request id -> None while armed, then the captured prompt KV.
        self._kv_captures: collections.OrderedDict[str, dict[str, Any] | None] = collections.OrderedDict()
        self._kv_lock = threading.Lock()

    # ---- thread-safe entry points -----------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        """Tokens the whole block pool holds."""
        return self.config.num_blocks * self.config.block_size

    def add_request(self, req: Request) -> None:
        """Queue a request (any thread).

        Raises:
            RequestRejected: prompt + max_tokens exceed the block pool, or the id is in use.
        """
        need = len(req.prompt) + req.max_tokens
        if need > self.capacity_tokens:
            raise RequestRejected(
                f"prompt ({len(req.prompt)} tokens) + max_tokens ({req.max_tokens}) = {need} "
                f"exceeds the KV block pool ({self.capacity_tokens} tokens = "
                f"{self.config.num_blocks} blocks x {self.config.block_size})")
        with self._inbox_lock:
            if req.request_id in self.requests or any(
                    r.request_id == req.request_id for r in self._inbox):
                raise RequestRejected(f"request id {req.request_id!r} is already in use")
            self._inbox.append(req)
        self.wake()

    def abort(self, request_id: str) -> None:
        """Ask the scheduler to abort a request (any thread; idempotent).

        The stage the request is in when the abort arrives is recorded (``/debug/requests``:
        ``abort.arrived_in``), so a client that aimed its cancel at a stage can see where it
        landed; a retrieve in progress keeps the scheduler busy, so the abort is handled after it
        (``abort.handled_in``).
        """
        with self._inbox_lock:
            self._abort_ids.add(request_id)
            req = self.requests.get(request_id)
            queued = any(r.request_id == request_id for r in self._inbox)
        with self._stage_lock:
            if request_id not in self._abort_arrivals:
                stage = req.stage if req is not None else ("queued" if queued else None)
                if stage is not None:
                    self._abort_arrivals[request_id] = stage
                    if req is not None:
                        req.abort_arrived_in = stage
        self.wake()

    # ---- stages (where a request's work is) --------------------------------------------
    def _set_stage(self, req: Request, stage: str) -> None:
        """Move ``req`` to ``stage`` and wake whoever waits for it (or for its end)."""
        req.stage = stage
        ended = stage in ("finished", "aborted")
        with self._stage_lock:
            if ended:
                self._ended[req.request_id] = {"stage": stage, "abort": self._abort_record(req)}
                while len(self._ended) > ENDED_KEPT:
                    self._ended.popitem(last=False)
                self._abort_arrivals.pop(req.request_id, None)
            waiters = self._stage_waiters.get(req.request_id, [])
            fire = [w for w in waiters if ended or w[0] == stage]
            for w in fire:
                waiters.remove(w)
            if not waiters:
                self._stage_waiters.pop(req.request_id, None)
        for _, callback in fire:
            callback(stage)

    def _abort_record(self, req: Request) -> dict[str, Any] | None:
        if req.abort_arrived_in is None and req.stage != "aborted":
            return None
        return {"arrived_in": req.abort_arrived_in, "handled_in": req.abort_handled_in}

    def request_view(self, request_id: str) -> dict[str, Any] | None:
        """Where request ``request_id`` is: ``{"request_id", "stage", "abort"}`` (any thread, no
        state lock, so it answers while a retrieve or a stall holds the scheduler); ``abort`` is
        ``{"arrived_in", "handled_in"}`` once an abort reached the engine. None when the id is
        unknown (not sent yet, or ended more than ENDED_KEPT requests ago)."""
        with self._stage_lock:
            ended = self._ended.get(request_id)
            if ended is not None:
                return {"request_id": request_id, **ended}
            req = self.requests.get(request_id)
            if req is None:
                with self._inbox_lock:
                    req = next((r for r in self._inbox if r.request_id == request_id), None)
            if req is None:
                return None
            return {"request_id": request_id, "stage": req.stage, "abort": self._abort_record(req)}

    def watch_stage(self, request_id: str, stage: str, callback: Any) -> Any:
        """Call ``callback(stage_entered)`` (from the scheduler thread) once ``request_id`` enters
        ``stage`` or ends (finished/aborted). Returns a token for :meth:`unwatch_stage`.

        Raises:
            ValueError: ``stage`` is not one of ``STAGES``.
        """
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; known: {', '.join(STAGES)}")
        entry = (stage, callback)
        with self._stage_lock:
            self._stage_waiters.setdefault(request_id, []).append(entry)
        return (request_id, entry)

    def unwatch_stage(self, token: Any) -> None:
        """Forget a watcher (idempotent)."""
        rid, entry = token
        with self._stage_lock:
            waiters = self._stage_waiters.get(rid)
            if waiters and entry in waiters:
                waiters.remove(entry)
                if not waiters:
                    self._stage_waiters.pop(rid, None)

    def hook(self, kind: str, arg: Any) -> concurrent.futures.Future:
        """Run a fault hook at the next step boundary.

        Args:
            kind: ``preempt`` (arg: request id | ``newest`` | ``all``) or ``stall``
                (arg: ``(point, seconds, count)``) or ``reset_prefix_cache`` or ``lmcache``
                (arg: ``(call, request_id, tokens)``, see :meth:`LMCacheConnector.raw_call`) or
                ``bugs`` (arg: the bug names planted from now on; the future raises ValueError for
                an unknown name, RuntimeError while a request is in the engine).

        Returns:
            a future with the hook's result (e.g. the preempted request ids).
        """
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._inbox_lock:
            self._hooks.append((kind, arg, fut))
        self.wake()
        return fut

    def wake(self) -> None:
        """Wake the scheduler thread."""
        self._wake.set()

    def start(self) -> None:
        """Start the scheduler thread (and the LMCache connection)."""
        if self.connector is not None:
            self.connector.start()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="engine-core")
        self._thread.start()

    def stop(self) -> None:
        """Stop the scheduler thread; abort what is left; close the connector."""
        self._stop.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.connector is not None:
            self.connector.close()

    # ---- loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self.state_lock:
                    busy = self.step()
            except Exception:  # noqa: BLE001 - the engine must keep serving
                log.exception("engine step failed")
                busy = False
            if not busy:
                polling = any(r.lookup_status == "pending" for r in self.waiting) or \
                    bool(self._aborting)
                self._wake.wait(0.002 if polling else 0.25)
                self._wake.clear()

    def step(self) -> bool:
        """Run one scheduler step (the caller holds ``state_lock``).

        Returns:
            True when model work was done (the loop then continues without waiting).
        """
        self._drain_inbox()
        if self.connector is not None:
            if ("no-reconnect" in self.bugs and self.connector.connected
                    and not self.connector.healthy):
                self.connector.abandon()
            self.connector.flush_deferred()
            lost = self.connector.check_end_sessions()
            if lost:
                self.metrics.inc("kvchaos_engine_end_sessions_lost_total", lost)
            lost = self.connector.check_lock_frees()
            if lost:
                self.metrics.inc("kvchaos_engine_lock_frees_lost_total", lost)
        self._progress_aborting()
        self._admit()
        worked = False
        # The batch of this step (what non-batch-invariant kernels' rounding depends on); only
        # read under batch-dependent numerics.
        batch = sum(1 for r in self.running if r.phase is Phase.RUNNING) if self.model.batch_noise else None
        for req in list(self.running):
            if req.phase is not Phase.RUNNING:
                continue
            try:
                worked |= self._work(req, batch)
            except Exception as exc:  # noqa: BLE001
                log.exception("request %s failed", req.request_id)
                self._abort_now(req, error=f"engine error: {exc}")
        self._update_gauges()
        return worked

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
            aborts, self._abort_ids = self._abort_ids, set()
            hooks, self._hooks = self._hooks, []
        for req in inbox:
            self.requests[req.request_id] = req
            self.waiting.append(req)
        for rid in aborts:
            req = self.requests.get(rid)
            if req is not None and req.phase in (Phase.WAITING, Phase.RUNNING):
                self._abort_now(req)
        for kind, arg, fut in hooks:
            try:
                fut.set_result(self._run_hook(kind, arg))
            except Exception as exc:  # noqa: BLE001
                fut.set_exception(exc)

    def _run_hook(self, kind: str, arg: Any) -> Any:
        if kind == "preempt":
            if arg == "all":
                targets = list(reversed(self.running))
            elif arg == "newest":
                targets = self.running[-1:]
            else:
                targets = [r for r in self.running if r.request_id == arg]
            for r in targets:
                self._preempt(r)
            return [r.request_id for r in targets]
        if kind == "stall":
            point, seconds, count = arg
            if point not in STALL_POINTS:
                raise ValueError(f"unknown stall point {point!r}; known: {STALL_POINTS}")
            # 0 s clears what is pending (kvchaos's reset between scenarios, a stall's heal)
            self._stalls[point] = [float(seconds)] * int(count) if seconds > 0 else []
            return {"point": point, "seconds": seconds, "count": count}
        if kind == "bugs":
            # Between steps, with no request in the engine: no request sees two sets of bugs.
            names = validate_bugs(list(arg))
            if self.requests:
                raise RuntimeError(f"{len(self.requests)} requests are in the engine; "
                                      "the planted bugs change only while it is idle")
            self.bugs = set(names)
            log.warning("planted bugs switched to %s", names)
            return {"bugs": names}
        if kind == "reset_prefix_cache":
            self.blocks.reset_prefix_cache()
            return True
        if kind == "lmcache":
            if self.connector is None or not self.connector.connected:
                raise RuntimeError("the engine has no LMCache connection")
            call, request_id, tokens = arg
            return self.connector.raw_call(call, request_id, tokens)
        raise ValueError(f"unknown hook {kind!r}")

    def _stall(self, point: str) -> None:
        if self._stalls[point]:
            seconds = self._stalls[point].pop()
            log.warning("hook: stalling %.2fs at %s", seconds, point)
            time.sleep(seconds)

    # ---- admission --------------------------------------------------------------------
    def _salt(self, req: Request) -> str:
        return "" if "drop-cache-salt" in self.bugs else (req.cache_salt or "")

    def _admit(self) -> None:
        seg = self.config.prefill_segment
        bs = self.config.block_size
        blocked = False
        for req in list(self.waiting):
            if req.phase is not Phase.WAITING:
                continue
            if req.stale_table is not None:
                if blocked or len(self.running) >= self.config.max_num_seqs:
                    break
                if not self._resume_stale(req):
                    blocked = True
                continue
            if not self._lookup_ready(req):
                continue
            if blocked or len(self.running) >= self.config.max_num_seqs:
                continue  # keep polling other lookups; admission is FIFO
            n_prompt = len(req.prompt)
            # Local prefix cache: only whole canonical segments, and never the last token.
            shareable = ((n_prompt - 1) // seg) * seg
            hit_blocks: list[int] = []
            if self.config.enable_prefix_caching and shareable > 0:
                hashes = block_hashes(req.prompt, bs, shareable // bs, self._salt(req))
                hit_blocks = self.blocks.match_prefix(hashes)
                keep = (len(hit_blocks) * bs // seg) * seg // bs
                self.blocks.free(hit_blocks[keep:])
                hit_blocks = hit_blocks[:keep]
            local_hit = len(hit_blocks) * bs
            need = -(-n_prompt // bs) - len(hit_blocks)
            fresh = self.blocks.allocate(need)
            if fresh is None:
                self.blocks.free(hit_blocks)
                blocked = True
                continue
            self.waiting.remove(req)
            req.block_table = hit_blocks + fresh
            req.num_computed = local_hit
            req.num_registered_blocks = len(hit_blocks)
            self.running.append(req)
            req.phase = Phase.RUNNING
            self._set_stage(req, "prefill")
            self._load_external(req, local_hit)
            if req.phase is Phase.WAITING:
                blocked = True  # planted retry-failed-load-forever: the head waits to retry
                continue
            if req.phase is not Phase.RUNNING:
                continue
            if not req.stats_frozen:
                req.local_hit_tokens = local_hit
                req.external_hit_tokens = max(0, req.num_computed - local_hit)
                req.stats_frozen = True
            self.metrics.inc("vllm:prefix_cache_queries_total", n_prompt)
            self.metrics.inc("vllm:prefix_cache_hits_total", local_hit)
            if req.lookup_status != "disabled":
                self.metrics.inc("vllm:external_prefix_cache_queries_total", n_prompt)
                self.metrics.inc("vllm:external_prefix_cache_hits_total",
                                 max(0, req.num_computed - local_hit))
            if "store-before-compute" in self.bugs:
                self._store(req)

    def _lookup_ready(self, req: Request) -> bool:
        """Submit or poll the request's LMCache lookup; True once it has an outcome."""
        conn = self.connector
        if conn is None or self.config.kv_role == "kv_producer":
            req.lookup_status = "disabled"  # a producer only stores: every token is computed
            return True
        if req.lookup_status == "unset":
            self._stall("before_lookup")
            if not conn.submit_lookup(req.request_id, req.prompt, self._salt(req)):
                req.lookup_status = "error"
                self.metrics.inc("kvchaos_engine_lookup_errors_total")
                return True
            req.lookup_status = "pending"
            self._set_stage(req, "lookup")
        if req.lookup_status != "pending":
            return True
        outcome = conn.poll_lookup(req.request_id)
        if outcome.status == "pending":
            return False
        if outcome.status == "timeout" and "repoll-timed-out-lookup" in self.bugs:
            self._repoll_timed_out_lookup(req)
        req.lookup_status = outcome.status
        req.lookup_tokens = outcome.tokens
        if outcome.status in ("timeout", "error"):
            self._free_unknown_locks(req)
        if outcome.status == "timeout":
            self.metrics.inc("kvchaos_engine_lookup_timeouts_total")
        elif outcome.status == "error":
            self.metrics.inc("kvchaos_engine_lookup_errors_total")
        return True

    def _repoll_timed_out_lookup(self, req: Request) -> None:
        """Planted bug ``repoll-timed-out-lookup`` (F5): poll the timed-out lookup again.

        Outside ``poll_lookup``'s guard, the adapter's ``KeyError`` escapes; like vLLM's engine
        core, whose busy loop dies on any exception, the engine process exits.
        """
        try:
            self.connector.repoll_timed_out_lookup(req.request_id)  # type: ignore[union-attr]
        except KeyError:
            log.critical("engine core died: KeyError polling the timed-out lookup of %s",
                         req.request_id, exc_info=True)
            logging.shutdown()
            os._exit(70)

    def _retry_load_later(self, req: Request) -> None:
        """Planted bug ``retry-failed-load-forever`` (F4): requeue a request whose load
        failed at the head of the queue, still counting on its hit, to retrieve it again next
        step instead of recomputing; nothing behind it is admitted meanwhile. The failure
        mark (``load_failed_tokens``) is never cleared, so even a retry that loads is
        retried: the request never finishes (vLLM issue 49176's livelock)."""
        self.running.remove(req)
        if req.block_table:
            self.blocks.free(req.block_table)
            req.block_table = []
        req.num_computed = 0
        req.num_registered_blocks = 0
        req.phase = Phase.WAITING
        self.waiting.appendleft(req)

    def _free_unknown_locks(self, req: Request) -> None:
        """Free whatever a lookup with an unknown outcome may have locked.

        The server releases only the chunks its prefetch recorded as locked for this
        session (lmcache ``LookupModule.free_lookup_locks``), so asking for the whole
        looked-up range is safe; it must precede END_SESSION (sent in order, deferred
        while the server is unhealthy).
        """
        conn = self.connector
        if conn is None:
            return
        chunk = conn.chunk_size or self.config.prefill_segment
        end = ((len(req.prompt) - 1) // chunk) * chunk
        conn.free_locks(req.request_id, req.prompt, self._salt(req), 0, end)

    def _load_external(self, req: Request, local_hit: int) -> None:
        """Retrieve LMCache's chunks beyond the local hit into the request's blocks."""
        conn = self.connector
        hit = req.lookup_tokens if req.lookup_status == "hit" else 0
        if conn is None or hit <= 0:
            return
        chunk = conn.chunk_size or self.config.prefill_segment
        bs = self.config.block_size
        salt = self._salt(req)
        start = (local_hit // chunk) * chunk
        if hit <= local_hit:
            # F8: the local prefix cache covers the whole LMCache hit, so no retrieve will
            # release the lookup's read locks: free them now.
            if "keep-locks-on-local-hit" not in self.bugs:
                conn.free_locks(req.request_id, req.prompt, salt, 0, hit)
            return
        if start:
            # F1: the local prefix cache holds [0, start); LMCache fills [start, hit) only.
            conn.free_locks(req.request_id, req.prompt, salt, 0, start)
        self._set_stage(req, "load")
        self._stall("before_retrieve")
        ok = conn.retrieve(req.request_id, req.prompt, salt, start, hit,
                           req.block_table[start // bs:hit // bs], local_hit - start)
        self._set_stage(req, "prefill")
        if not ok:
            self.metrics.inc("kvchaos_engine_load_failures_total")
            self.metrics.inc("kvchaos_engine_load_failed_tokens_total", hit - local_hit)
            if "retry-failed-load-forever" in self.bugs:
                req.load_failed_tokens += hit - local_hit
                self._retry_load_later(req)
                return
            req.load_failed_tokens += hit - local_hit
            free_end = hit - chunk if "short-free-after-failed-load" in self.bugs else hit
            conn.free_locks(req.request_id, req.prompt, salt, start, free_end)
            if "trust-failed-load" not in self.bugs:
                if self.config.kv_load_failure_policy == "fail":
                    self._abort_now(req, error=(
                        f"KV load from LMCache failed for {hit - local_hit} tokens "
                        "(kv_load_failure_policy=fail)"), code=500)
                return
        elif "retry-failed-load-forever" in self.bugs and req.load_failed_tokens:
            self._retry_load_later(req)  # the failure mark is never cleared: retry again
            return
        computed = hit
        if "hit-plus-one-token" in self.bugs:
            computed = min(hit + 1, len(req.prompt) - 1)
        elif "hit-plus-one-chunk" in self.bugs:
            computed = min(hit + chunk, len(req.prompt) - 1)
        req.num_computed = computed
        req.stored_upto = max(req.stored_upto, hit)
        self._register_prefix(req)

    def _resume_stale(self, req: Request) -> bool:
        """Planted bug ``stale-blocks-on-resume``: resume on a block table whose contents are
        not this request's KV (its old ids where still free, other blocks where not), keeping
        the progress made before preemption, so the tokens "already computed" are never
        recomputed (F10: more tokens counted as computed than the KV holds)."""
        table = self.blocks.allocate_specific(req.stale_table or [])
        if table is None:
            return False
        if table == req.stale_table:
            # Its own blocks came back untouched: the KV would still be right. The bug is
            # that nothing guarantees this; take other blocks where the pool has them.
            others = self.blocks.allocate(len(table))
            if others is not None:
                self.blocks.free(table)
                table = others
        self.waiting.remove(req)
        req.block_table = table
        req.num_computed = req.stale_computed
        req.stale_table = None
        req.phase = Phase.RUNNING
        self.running.append(req)
        return True

    # ---- model work ---------------------------------------------------------------------
    def _register_prefix(self, req: Request) -> None:
        """Publish the request's canonical prompt blocks to the local prefix cache."""
        if not self.config.enable_prefix_caching:
            return
        seg, bs = self.config.prefill_segment, self.config.block_size
        canonical = (min(req.num_computed, len(req.prompt)) // seg) * seg // bs
        if canonical <= req.num_registered_blocks:
            return
        hashes = block_hashes(req.prompt, bs, canonical, self._salt(req))
        for i in range(req.num_registered_blocks, canonical):
            self.blocks.register(req.block_table[i], hashes[i])
        req.num_registered_blocks = canonical

    def _work(self, req: Request, batch: int | None = None) -> bool:
        n_prompt = len(req.prompt)
        seg = self.config.prefill_segment
        if req.num_computed < n_prompt:
            start = req.num_computed
            end = min(n_prompt, (start // seg + 1) * seg)
            logits = self.model.forward(req.prompt[start:end], start, req.block_table, self.pool, batch)
            req.num_computed = end
            self.metrics.inc("vllm:prompt_tokens_total", end - start)
            self._register_prefix(req)
            if end < n_prompt:
                return True
            self._capture_kv(req)
            self._store(req)
            self._emit_next(req, logits)
            return True
        # Decode (or replay after a resume): feed the token at position num_computed.
        pos = req.num_computed
        if not self._ensure_block(req, pos):
            return False
        logits = self.model.forward([req.all_tokens[pos]], pos, req.block_table, self.pool, batch)
        req.num_computed = pos + 1
        self._emit_next(req, logits)
        return True

    # ---- /debug/kv: the KV a request attends over -------------------------------------
    KV_CAPTURES_KEPT = 8

    def arm_kv_capture(self, request_id: str) -> None:
        """Capture the prompt KV of ``request_id`` once its prefill ends (any thread; send the
        request after this returns). At most :attr:`KV_CAPTURES_KEPT` are kept (oldest dropped)."""
        with self._kv_lock:
            self._kv_captures[request_id] = None
            while len(self._kv_captures) > self.KV_CAPTURES_KEPT:
                self._kv_captures.popitem(last=False)

    def kv_capture(self, request_id: str) -> tuple[bool, dict[str, Any] | None]:
        """``(armed, capture)``: the captured prompt KV of ``request_id`` (popped once taken),
        None while its prefill has not ended. A capture holds ``kv`` (``[2, num_layers,
        prompt_tokens, num_kv_heads * head_size]``, K then V, the pool's dtype), ``local_hit_tokens``
        and ``external_hit_tokens`` (what the engine reports)."""
        with self._kv_lock:
            if request_id not in self._kv_captures:
                return False, None
            cap = self._kv_captures[request_id]
            if cap is not None:
                del self._kv_captures[request_id]
            return True, cap

    def _capture_kv(self, req: Request) -> None:
        """At the end of the prefill: copy the KV of every prompt position from the request's
        blocks (what its decode attends over: loaded, then computed), if armed."""
        with self._kv_lock:
            if req.request_id not in self._kv_captures or self._kv_captures[req.request_id] is not None:
                return
        bs = self.config.block_size
        pos = torch.arange(len(req.prompt))
        table = torch.tensor(req.block_table, dtype=torch.long)
        slots = table[pos // bs] * bs + pos % bs
        layers = [self.pool.layer_flat(i)[:, slots].reshape(2, len(req.prompt), -1)
                  for i in range(len(self.pool.layers))]
        cap = {"kv": torch.stack(layers, dim=1).clone(), "local_hit_tokens": req.local_hit_tokens,
               "external_hit_tokens": req.external_hit_tokens}
        with self._kv_lock:
            if req.request_id in self._kv_captures:
                self._kv_captures[req.request_id] = cap

    def _ensure_block(self, req: Request, pos: int) -> bool:
        """Make sure position ``pos`` has a block, preempting the newest requests if needed.

        Returns:
            False when ``req`` itself was preempted.
        """
        bs = self.config.block_size
        while len(req.block_table) * bs <= pos:
            got = self.blocks.allocate(1)
            if got is not None:
                req.block_table.extend(got)
                continue
            victim = self.running[-1]
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _emit_next(self, req: Request, logits: torch.Tensor) -> None:
        """Greedy-pick the token after position ``num_computed - 1``; send or check it."""
        token = int(torch.argmax(logits))
        index = req.num_computed - len(req.prompt)  # index into output
        if index < len(req.output):
            if req.output[index] != token:
                self.metrics.inc("kvchaos_engine_replay_mismatches_total")
                log.error("request %s: replayed token %d is %d, was %d", req.request_id,
                          index, token, req.output[index])
            return
        event = TokenEvent(token_id=token)
        if req.logprobs is not None:
            lp = torch.log_softmax(logits.float(), dim=-1)
            event.logprob = float(lp[token])
            if req.logprobs > 0:
                vals, ids = torch.topk(lp, min(req.logprobs, lp.shape[0]))
                event.top_logprobs = {int(i): float(v) for v, i in zip(vals, ids)}
        req.output.append(token)
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        if req.stage != "decode":
            self._set_stage(req, "decode")
        self.metrics.inc("vllm:generation_tokens_total")
        self._send(req, event)
        if len(req.output) >= req.max_tokens:
            self._finish(req, "length")
        elif token == EOS_ID and not req.ignore_eos:
            self._finish(req, "stop")

    def _store(self, req: Request) -> None:
        """Store the prompt's full chunks not stored yet (full chunks only, prompt only)."""
        conn = self.connector
        if conn is None or not conn.connected:
            return
        chunk = conn.chunk_size or self.config.prefill_segment
        bs = self.config.block_size
        full_end = (len(req.prompt) // chunk) * chunk
        start = (req.stored_upto // chunk) * chunk
        if full_end <= start:
            return
        block_ids = req.block_table[start // bs:full_end // bs]
        if start:
            # A store after an LMCache hit (or an earlier store): only the chunks past it,
            # each from its own blocks.
            log.debug("request %s: store [%d, %d) after %d stored or loaded tokens",
                      req.request_id, start, full_end, start)
            if "store-after-hit-wrong-blocks" in self.bugs:
                block_ids = req.block_table[:len(block_ids)]
        self._stall("before_store")
        ok = conn.store(req.request_id, req.prompt, self._salt(req), start, full_end, block_ids)
        req.stored_upto = full_end
        if ok:
            self.metrics.inc("kvchaos_engine_stored_tokens_total", full_end - start)
        elif conn.healthy:
            self.metrics.inc("kvchaos_engine_store_failures_total")

    # ---- ends of a request --------------------------------------------------------------
    def _send(self, req: Request, event: TokenEvent) -> None:
        if req.sink is not None:
            try:
                req.sink(event)
            except Exception:  # noqa: BLE001 - a closed client must not stop the engine
                log.debug("sink for %s failed", req.request_id, exc_info=True)

    def _release(self, req: Request, leak_lmcache: bool = False) -> None:
        """Free blocks and LMCache state of a request leaving the running/waiting sets."""
        self._release_blocks_only(req)
        conn = self.connector
        if conn is None:
            return
        if leak_lmcache:
            conn.forget_lookup(req.request_id)
            conn.open_sessions.discard(req.request_id)
            return
        conn.end_request(req.request_id)

    def _finish(self, req: Request, reason: str) -> None:
        self._release(req)
        req.phase = Phase.FINISHED
        self._set_stage(req, "finished")
        self.metrics.inc("vllm:request_success_total", finished_reason=reason)
        self._send(req, TokenEvent(final=True, finish_reason=reason))
        self.requests.pop(req.request_id, None)

    def _abort_now(self, req: Request, error: str | None = None, code: int = 500) -> None:
        """Abort ``req``: free blocks; free lookup locks and end the LMCache session."""
        self.metrics.inc("kvchaos_engine_aborts_total")
        req.abort_handled_in = req.stage
        leak = "skip-abort-cleanup" in self.bugs and error is None
        if "hold-blocks-on-abort" in self.bugs and error is None and req.block_table:
            # Planted bug: the blocks stay allocated and nobody owns them any more.
            self.held_blocks += len(req.block_table)
            req.block_table = []
        if req.lookup_status == "pending" and not leak:
            # The prefetch may still take locks: finish it, then free them (F9).
            self._release_blocks_only(req)
            req.phase = Phase.ABORTED
            self._aborting.append(req)
        else:
            if req.lookup_status == "hit" and req.phase is Phase.WAITING and not leak:
                self.connector.free_locks(req.request_id, req.prompt,  # type: ignore[union-attr]
                                          self._salt(req), 0, req.lookup_tokens)
            self._release(req, leak_lmcache=leak)
            req.phase = Phase.ABORTED
            self.requests.pop(req.request_id, None)
        self._set_stage(req, "aborted")
        self._send(req, TokenEvent(final=True, finish_reason="abort", error=error,
                                   error_code=code))

    def _release_blocks_only(self, req: Request) -> None:
        """Take ``req`` out of the running/waiting sets and free its KV blocks."""
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if req.block_table:
            self.blocks.free(req.block_table)
            req.block_table = []

    def _progress_aborting(self) -> None:
        """Finish the LMCache clean-up of aborted requests whose lookup was in flight."""
        for req in list(self._aborting):
            outcome = self.connector.poll_lookup(req.request_id)  # type: ignore[union-attr]
            if outcome.status == "pending":
                continue
            if outcome.tokens > 0:
                self.connector.free_locks(req.request_id, req.prompt,  # type: ignore[union-attr]
                                          self._salt(req), 0, outcome.tokens)
            elif outcome.status in ("timeout", "error"):
                self._free_unknown_locks(req)
            self.connector.end_request(req.request_id)  # type: ignore[union-attr]
            self._aborting.remove(req)
            self.requests.pop(req.request_id, None)

    def _preempt(self, req: Request) -> None:
        """Recompute-style preemption: free everything, requeue at the head."""
        self.running.remove(req)
        if "stale-blocks-on-resume" in self.bugs:
            req.stale_table = list(req.block_table)
            req.stale_computed = req.num_computed
        if req.block_table:
            self.blocks.free(req.block_table)
            req.block_table = []
        req.num_computed = 0
        req.num_registered_blocks = 0
        req.stored_upto = 0
        if self.connector is not None:
            self.connector.end_request(req.request_id)
            self.connector.forget_lookup(req.request_id)
            req.lookup_status = "unset"
            req.lookup_tokens = 0
        req.phase = Phase.WAITING
        self._set_stage(req, "queued")
        req.num_preemptions += 1
        self.metrics.inc("vllm:num_preemptions_total")
        self.waiting.appendleft(req)
        log.info("preempted %s", req.request_id)

    # ---- observability ------------------------------------------------------------------
    def _update_gauges(self) -> None:
        self.metrics.set("vllm:num_requests_running", len(self.running))
        self.metrics.set("vllm:num_requests_waiting", len(self.waiting))
        self.metrics.set("vllm:kv_cache_usage_perc", self.blocks.usage())
        self.metrics.set("kvchaos_engine_lmcache_healthy",
                         1.0 if self.connector is not None and self.connector.healthy else 0.0)
        self.metrics.set("kvchaos_engine_lmcache_heartbeats",
                         float(self.connector.heartbeats_running) if self.connector is not None else 0.0)

    def debug_state(self) -> dict[str, Any]:
        """The ``/debug/state`` document (see docs/architecture.md section 2)."""
        with self.state_lock:
            conn = self.connector
            held = sum(len(r.block_table) for r in self.requests.values())
            return {
                "fingerprint": self.fingerprint,
                "engine_version": __version__,
                "blocks_total": self.blocks.num_blocks,
                "blocks_free": self.blocks.num_free,
                "blocks_used": self.blocks.num_used,
                "blocks_held_by_requests": held,
                "prefix_cache_blocks": self.blocks.num_cached,
                "num_open_sessions": len(conn.open_sessions) if conn else 0,
                "open_sessions": sorted(conn.open_sessions) if conn else [],
                "num_pending_lookups": len(conn.pending_lookups()) if conn else 0,
                "pending_lookups": conn.pending_lookups() if conn else [],
                "lmcache": None if conn is None else {
                    "url": conn.url, "state": conn.state(), "chunk_size": conn.chunk_size,
                    "connect_error": conn.connect_error},
                "requests": {rid: r.debug() for rid, r in self.requests.items()},
                "num_running": len(self.running),
                "num_waiting": len(self.waiting),
                "bugs": sorted(self.bugs),
                "config": self.config.to_dict(),
            }
