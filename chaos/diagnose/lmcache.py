"""Reading what an LMCache MP server holds, with LMCache's own client, hasher and key formats.

    KVReader ──(LMCacheMPSchedulerAdapter: LOOKUP, FREE_LOOKUP_LOCKS, END_SESSION)──> lmcache server
             └─(LMCacheMPWorkerAdapter: register a small CPU KV buffer, RETRIEVE into it)──┘
    stored_entries ── L2 keys: fs adapter file names, Redis (resp adapter) keys ── ObjectKey

The reader is one more KV "engine" registered with the server: it looks a prompt up and
retrieves its chunks into its own buffer, exactly what an engine would be served (from L1, or
from L2 through the server's prefetch). It never imports the reference engine, so it works for
any engine that stores through LMCache; it only needs the model name in the keys and the KV
layout. The reader's blocks have the engine's paged format (``paged``, chaos.stack.spec
KvLayout): LMCache picks its transfer format from the registered tensors (lmcache
``compute_kv_layout``) and the object bytes are that format's, so a reader registered in
another format is served objects it cannot scatter (``scatter_cpu_to_paged_kv``: "shape ... is
invalid", the retrieve answered as failed). ``kv_planes``: objects ``[2, num_layers,
chunk_size, hidden_dim]``; ``cpu_attn`` (vLLM CPU): objects ``[num_layers, chunk_size,
2 * hidden_dim]`` holding the engine's block memory, decoded here the way vLLM's CPU attention
reads its blocks. Every lookup's read locks are freed and its session ended before a call
returns.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from chaos.httppool import pool_limits
from chaos.stack.environment import TELEMETRY_OFF

os.environ.update(TELEMETRY_OFF)  # before lmcache is imported (it reads them at import)

_BLOCK_SIZE = 16  # the reader's block size where the object layout does not depend on it
_TORCH_DTYPES = ("float32", "float16", "bfloat16")
_PAGED = ("kv_planes", "cpu_attn")


def quiet_lmcache() -> None:
    """Import the lmcache modules the reader uses with LMCache's log level at WARNING, and set
    every ``lmcache*`` logger of this process to WARNING (LMCache's ``init_logger`` gives each
    module its own INFO handler, read at import, which would print dozens of lines before a
    diagnosis's verdicts). ``LMCACHE_LOG_LEVEL`` is restored after the imports, so services this
    process starts later keep their own level; the servers' logs are not touched."""
    import logging

    before = os.environ.get("LMCACHE_LOG_LEVEL")
    os.environ["LMCACHE_LOG_LEVEL"] = "WARNING"
    try:
        import lmcache.integration.vllm.vllm_multi_process_adapter  # noqa: F401
        import lmcache.v1.distributed.l2_adapters.fs_l2_adapter  # noqa: F401
        import lmcache.v1.multiprocess.group_view  # noqa: F401
        import lmcache.v1.multiprocess.token_hasher  # noqa: F401
    finally:
        if before is None:
            os.environ.pop("LMCACHE_LOG_LEVEL", None)
        else:
            os.environ["LMCACHE_LOG_LEVEL"] = before
    for name in list(logging.root.manager.loggerDict):
        if name == "lmcache" or name.startswith("lmcache."):
            logging.getLogger(name).setLevel(logging.WARNING)


class LMCacheReadError(RuntimeError):
    """LMCache did not answer, or answered something the reader cannot use."""


@dataclass
class ServerInfo:
    """What an LMCache MP server says about itself over HTTP (``GET /config``, ``/status``).

    Attributes:
        http: the HTTP API base URL.
        zmq_url: the server's own ``tcp://host:port`` (from ``/config`` ``mp``).
        chunk_size: tokens per chunk.
        hash_algorithm: the TokenHasher algorithm (``blake3`` by default).
        model_names: model names of the KV contexts engines registered (sorted).
        fs_paths: base paths of its ``fs`` L2 adapters.
        redis: ``(host, port, username, password)`` of its ``resp`` L2 adapters.
        serde: L2 adapters whose objects are serialized (their ``serde_config``), by index.
    """

    http: str
    zmq_url: str
    chunk_size: int
    hash_algorithm: str
    model_names: list[str] = field(default_factory=list)
    fs_paths: list[str] = field(default_factory=list)
    redis: list[tuple[str, int, str, str]] = field(default_factory=list)
    serde: dict[int, Any] = field(default_factory=dict)


def server_info(http: str, timeout_s: float = 10.0) -> ServerInfo:
    """Read an LMCache MP server's config and registered contexts over its HTTP API.

    Args:
        http: base URL of the server's HTTP API (``--http-port``).

    Raises:
        LMCacheReadError: the API did not answer or lacks the ``mp`` config.
    """
    base = http.rstrip("/")
    try:
        with httpx.Client(timeout=timeout_s, limits=pool_limits()) as client:
            config = client.get(f"{base}/config").raise_for_status().json()
            status = client.get(f"{base}/status").raise_for_status().json()
    except (httpx.HTTPError, ValueError) as exc:
        raise LMCacheReadError(f"LMCache HTTP API at {base} did not answer: {exc}") from exc
    mp = config.get("mp") or {}
    if "port" not in mp:
        raise LMCacheReadError(f"LMCache at {base}: /config has no mp.port")
    models: set[str] = set()
    for key in ("non_cuda_context_meta", "cache_context_meta"):
        for meta in (status.get(key) or {}).values():
            if isinstance(meta, dict) and meta.get("model_name"):
                models.add(str(meta["model_name"]))
    info = ServerInfo(http=base, zmq_url=f"tcp://{mp.get('host', '127.0.0.1')}:{mp['port']}",
                      chunk_size=int(mp.get("chunk_size") or 256),
                      hash_algorithm=str(mp.get("hash_algorithm") or "blake3"), model_names=sorted(models))
    adapters = ((config.get("storage_manager") or {}).get("l2_adapter_config") or {}).get("adapters") or []
    for i, a in enumerate(adapters):
        if a.get("serde_config"):
            info.serde[i] = a["serde_config"]
        if "base_path" in a:
            info.fs_paths.append(str(a["base_path"]))
        elif "host" in a and "port" in a:
            info.redis.append((str(a["host"]), int(a["port"]), str(a.get("username") or ""),
                               str(a.get("password") or "")))
    return info


def chunk_hashes(token_ids: list[int], chunk_size: int, hash_algorithm: str = "blake3") -> list[bytes]:
    """The rolling chunk hashes LMCache keys the prompt's full chunks with (its own
    ``TokenHasher``), one per full chunk."""
    quiet_lmcache()
    from lmcache.v1.multiprocess.token_hasher import TokenHasher


    return TokenHasher(chunk_size, hash_algorithm).compute_chunk_hashes(list(token_ids))


def stored_entries(info: ServerInfo, hashes: list[bytes], timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """Every L2 object of the server whose chunk hash is one of ``hashes``.

    Read from the adapters' own key formats: the ``fs`` adapter's file names (its
    ``_filename_to_object_key``) and the ``resp`` adapter's Redis keys
    (``model@rank@group@hash[@salt]``, its ``_object_key_to_string``). L1 has no listing; a
    lookup (``KVReader.lookup``) covers it.

    Returns:
        ``[{"model_name", "cache_salt", "kv_rank", "object_group_id", "chunk": index in hashes,
        "chunk_hash": hex, "where": "l2:fs" | "l2:resp"}]``.
    """
    quiet_lmcache()
    from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import _filename_to_object_key


    index = {h: i for i, h in enumerate(hashes)}
    out: list[dict[str, Any]] = []
    for base in info.fs_paths:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            key = _filename_to_object_key(name)
            if key is not None and key.chunk_hash in index:
                out.append({"model_name": key.model_name, "cache_salt": key.cache_salt, "kv_rank": key.kv_rank,
                            "object_group_id": getattr(key, "object_group_id", 0),
                            "chunk": index[key.chunk_hash], "chunk_hash": key.chunk_hash.hex(), "where": "l2:fs"})
    if info.redis:
        import redis

        for host, port, user, password in info.redis:
            try:
                client = redis.Redis(host=host, port=port, username=user or None, password=password or None,
                                     socket_timeout=timeout_s)
                for h, i in index.items():
                    for raw in itertools.islice(client.scan_iter(match=f"*@{h.hex()}*", count=1000), 1000):
                        parts = raw.decode(errors="replace").split("@")
                        if len(parts) in (4, 5) and parts[3] == h.hex():
                            out.append({"model_name": parts[0], "cache_salt": parts[4] if len(parts) == 5 else "",
                                        "kv_rank": int(parts[1]), "object_group_id": int(parts[2]),
                                        "chunk": i, "chunk_hash": h.hex(), "where": "l2:resp"})
                client.close()
            except redis.RedisError:
                continue
    return out


class KVReader:
    """An LMCache client that looks prompts up and reads their chunks' KV (CPU, synchronous).

    Args:
        url: the server's ZMQ address ``tcp://host:port``.
        model_name: the model name in the keys (the engine's).
        num_layers, hidden_dim, dtype: the KV layout (``hidden_dim`` = KV heads x head size).
        chunk_size: the server's chunk size.
        paged: the engine's paged KV format, ``kv_planes`` or ``cpu_attn`` (chaos.stack.spec
            KvLayout).
        num_kv_heads: KV heads (``cpu_attn``).
        block_size: the engine's tokens per block (``cpu_attn``; must divide ``chunk_size``).
        max_tokens: the longest prefix one read covers (sizes the buffer).
        mq_timeout_s: bound of every LMCache call.

    Raises:
        ValueError: a layout the reader cannot describe (unknown dtype or paged format,
            ``cpu_attn`` without heads or block size, heads not dividing ``hidden_dim``, a
            block size not dividing the chunk).
        LMCacheReadError: on connect/register failure (from ``__enter__``).
    """

    def __init__(self, url: str, model_name: str, *, num_layers: int, hidden_dim: int, dtype: str,
                 chunk_size: int, paged: str = "kv_planes", num_kv_heads: int | None = None,
                 block_size: int | None = None, max_tokens: int = 8192, mq_timeout_s: float = 5.0) -> None:
        if dtype not in _TORCH_DTYPES:
            raise ValueError(f"dtype must be one of {_TORCH_DTYPES}, got {dtype!r}")
        if paged not in _PAGED:
            raise ValueError(f"paged must be one of {_PAGED}, got {paged!r}")
        if paged == "cpu_attn":
            if not num_kv_heads or not block_size:
                raise ValueError("paged cpu_attn needs num_kv_heads and block_size (the engine's)")
            if hidden_dim % num_kv_heads:
                raise ValueError(f"hidden_dim {hidden_dim} is not a multiple of num_kv_heads {num_kv_heads}")
        else:  # the object layout does not depend on the block size or the head split
            num_kv_heads, block_size = 1, _BLOCK_SIZE
        if chunk_size % block_size:
            raise ValueError(f"block size {block_size} does not divide the chunk size {chunk_size}")
        self.url, self.model_name = url, model_name
        self.num_layers, self.hidden_dim, self.dtype = num_layers, hidden_dim, dtype
        self.paged, self.num_kv_heads, self.block_size = paged, num_kv_heads, block_size
        self.chunk_size = chunk_size
        self.mq_timeout_s = mq_timeout_s
        self._chunks = max(1, -(-max_tokens // chunk_size))
        self._scheduler = self._worker = None
        self._kv: dict[str, Any] = {}
        self._n = 0

    def __enter__(self) -> KVReader:
        import torch
        import zmq

        quiet_lmcache()
        from lmcache.integration.vllm.vllm_multi_process_adapter import (
            LMCacheMPSchedulerAdapter,
            LMCacheMPWorkerAdapter,
            ParallelStrategy,
        )
        from lmcache.v1.multiprocess.group_view import EngineGroupInfo

        # Block 0 is LMCache's null block id (mp.null_block_id): never a target.
        bs = self.block_size
        blocks = 1 + self._chunks * self.chunk_size // bs
        dt = getattr(torch, self.dtype)
        if self.paged == "cpu_attn":
            # vLLM CPU's per-layer view [NB, NH, BS, 2*HS] with its HND hint (NL_X_NB_NH_BS_CS).
            shape: tuple[int, ...] = (blocks, self.num_kv_heads, bs, 2 * self.hidden_dim // self.num_kv_heads)
            hint = "HND"
        else:
            # One "head" of hidden_dim: the object layout only sees num_layers x hidden_dim.
            shape, hint = (2, blocks, bs, 1, self.hidden_dim), "NHD"
        self._kv = {f"model.layers.{i}.self_attn": torch.zeros(*shape, dtype=dt) for i in range(self.num_layers)}
        strategy = ParallelStrategy(mla_only=False, vllm_world_size=1, vllm_worker_id=0, tp_size=1, pp_size=1,
                                    n_servers=1)
        extra = {"lmcache.mp.mq_timeout": self.mq_timeout_s, "lmcache.mp.heartbeat_interval": 2.0}
        ctx = zmq.Context.instance()
        try:
            self._scheduler = LMCacheMPSchedulerAdapter([self.url], ctx, self.model_name, bs, strategy,
                                                        extra_config=extra)
            self._worker = LMCacheMPWorkerAdapter(self.url, ctx, self.model_name, bs, strategy,
                                                  extra_config=extra)
            self._worker.register_kv_caches(
                self._kv, [EngineGroupInfo(engine_group_id=0, layer_indices=tuple(range(self.num_layers)),
                                           tokens_per_block=bs)], {"kv_layout": hint})
        except Exception as exc:  # noqa: BLE001 - any failure: this server cannot be read
            self.close()
            raise LMCacheReadError(f"cannot register a KV reader with LMCache at {self.url}: {exc}") from exc
        if self._scheduler.lmcache_tokens_per_chunk != self.chunk_size:
            got = self._scheduler.lmcache_tokens_per_chunk
            self.close()
            raise LMCacheReadError(f"LMCache at {self.url} uses chunks of {got} tokens, not {self.chunk_size}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Unregister from the server (idempotent)."""
        for adapter in (self._worker, self._scheduler):
            if adapter is not None:
                try:
                    adapter.shutdown()
                except Exception:  # noqa: BLE001
                    pass
        self._worker = self._scheduler = None

    def _rid(self) -> str:
        self._n += 1
        return f"kvchaos-diagnose-{uuid.uuid4().hex[:8]}-{self._n}"

    def _lookup(self, rid: str, token_ids: list[int], salt: str, reserve_last_token: bool) -> int:
        s = self._scheduler
        assert s is not None, "use KVReader as a context manager"
        s.maybe_submit_lookup_request(rid, list(token_ids), cache_salt=salt, reserve_last_token=reserve_last_token)
        deadline = time.monotonic() + self.mq_timeout_s + 1.0
        while (hit := s.check_lookup_result(rid)) is None:
            if time.monotonic() > deadline:
                s.end_session(rid)
                raise LMCacheReadError(f"LMCache at {self.url} did not answer a lookup in {self.mq_timeout_s}s")
            time.sleep(0.002)
        if not s.is_healthy:
            raise LMCacheReadError(f"LMCache at {self.url} is unhealthy")
        return int(hit)

    def _end(self, rid: str) -> None:
        s = self._scheduler
        assert s is not None
        s.end_session(rid)
        s.cleanup_lookup_result(rid)

    def lookup(self, token_ids: list[int], salt: str = "", *, reserve_last_token: bool = True) -> int:
        """Tokens LMCache holds for the prompt's prefix under ``salt`` (a multiple of the chunk
        size), the last prompt token reserved as engines do; locks freed, session ended.

        Raises:
            LMCacheReadError: no answer within the MQ timeout.
        """
        rid = self._rid()
        try:
            hit = self._lookup(rid, token_ids, salt, reserve_last_token)
            if hit > 0:
                self._scheduler.free_lookup_locks(list(token_ids), 0, hit, rid, cache_salt=salt)  # type: ignore[union-attr]
        finally:
            self._end(rid)
        return hit

    def read(self, token_ids: list[int], salt: str = "", end: int | None = None):
        """The KV LMCache serves for the prompt's prefix chunks under ``salt``.

        Args:
            token_ids: the prompt.
            salt: the cache_salt of the key.
            end: read at most this many tokens (rounded down to whole chunks).

        Returns:
            ``(tokens_read, tensor)``; tensor ``[chunks, 2, num_layers, chunk_size, hidden_dim]``
            (K then V), None when LMCache holds no chunk.

        Raises:
            LMCacheReadError: the lookup or the retrieve failed.
        """
        import torch
        from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp

        limit = self._chunks * self.chunk_size if end is None else min(end, self._chunks * self.chunk_size)
        limit = (limit // self.chunk_size) * self.chunk_size
        rid = self._rid()
        try:
            hit = self._lookup(rid, token_ids, salt, False)
            n = min(hit, limit)
            if hit > n:
                self._scheduler.free_lookup_locks(list(token_ids), n, hit, rid, cache_salt=salt)  # type: ignore[union-attr]
            if n <= 0:
                return 0, None
            for t in self._kv.values():
                t.zero_()
            nb = n // self.block_size
            op = LoadStoreOp(token_ids=list(token_ids), block_ids=[list(range(1, 1 + nb))], start=0, end=n,
                             skip_first_n_tokens=0)
            w = self._worker
            w.submit_retrieve_request(rid, op, None, cache_salt=salt)  # type: ignore[union-attr]
            # The retrieve is answered asynchronously (get_finished polls its future): on a busy
            # server it is not done when submit returns (vLLM stack, 2026-12-06: the server had
            # logged "Retrieved 512 tokens" while a single poll said not finished).
            deadline = time.monotonic() + self.mq_timeout_s + 1.0
            while True:
                _, done = w.get_finished(set())  # type: ignore[union-attr]
                if rid in (w.get_failed_request_ids() or set()):  # type: ignore[union-attr]
                    raise LMCacheReadError(f"LMCache at {self.url} failed to retrieve {n} tokens")
                if rid in (done or set()):
                    break
                if time.monotonic() > deadline:
                    raise LMCacheReadError(f"LMCache at {self.url} did not finish retrieving {n} tokens in "
                                           f"{self.mq_timeout_s + 1.0:g}s")
                time.sleep(0.002)
        finally:
            self._end(rid)
        per_layer = [self._kv_of_layer(self._kv[f"model.layers.{i}.self_attn"], nb, n) for i in range(self.num_layers)]
        kv = torch.stack(per_layer, dim=1)  # [2, L, n, H]
        chunks = n // self.chunk_size
        out = kv.reshape(2, self.num_layers, chunks, self.chunk_size, self.hidden_dim).permute(2, 0, 1, 3, 4)
        return n, out.contiguous().clone()

    def _kv_of_layer(self, layer, nb: int, n: int):
        """The K and V of blocks ``1..nb`` of one layer of the reader's buffer as ``[2, n, H]``
        (tokens in order, H = heads x head size, head-major)."""
        import torch

        if self.paged == "kv_planes":  # [2, blocks, bs, 1, H]
            return layer[:, 1:1 + nb, :, 0, :].reshape(2, n, self.hidden_dim)
        # cpu_attn: vLLM's CPU attention views a layer [NB, NH, BS, 2*HS] as [NB, NH, 2*BS, HS]
        # and cuts it into K (the first BS*HS elements of each block's head) and V
        # (vllm/v1/attention/backends/cpu_attn.py, CPUAttentionBackendImpl.forward); its cache
        # write (ops.cpu_attn_reshape_and_cache, ISAs vec and vec16) stores K dimension-major,
        # [HS, BS], and V token-major, [BS, HS] (checked against that kernel:
        # tests/vllm/test_diagnose_reader.py).
        blocks, heads, bs, twice_hs = layer.shape
        hs = twice_hs // 2
        mem = layer.view(blocks, heads, 2 * bs * hs)[1:1 + nb]
        k = mem[..., :bs * hs].reshape(nb, heads, hs, bs).permute(0, 3, 1, 2)  # [nb, BS, NH, HS]
        v = mem[..., bs * hs:].reshape(nb, heads, bs, hs).permute(0, 2, 1, 3)
        return torch.stack([t.reshape(n, self.hidden_dim) for t in (k, v)])


def delete_objects(info: ServerInfo, keys: list[dict[str, Any]], timeout_s: float = 10.0) -> list[str]:
    """Delete objects from every tier of the server with LMCache's own ``DELETE /cache/objects``
    (L1 and the primary L2 adapter with ``tier: all``, then each other L2 adapter).

    Args:
        keys: ``{"chunk_hash_hex", "model_name", "kv_rank", "object_group_id", "cache_salt"}``
            (lmcache ``EncodedObjectKey``).

    Returns:
        Problems, one line each (empty: every call succeeded).
    """
    if not keys:
        return []
    base = info.http.rstrip("/")
    problems: list[str] = []
    try:
        with httpx.Client(timeout=timeout_s, limits=pool_limits()) as client:
            names: list[str] = []
            r = client.get(f"{base}/config/adapters")
            if r.status_code == 200:
                names = [str(a.get("type_name")) for a in (r.json().get("adapters") or []) if a.get("type_name")]
            bodies = [{"keys": keys, "tier": "all", "force": True}]
            bodies += [{"keys": keys, "tier": "l2", "adapter": n} for n in dict.fromkeys(names[1:])]
            for body in bodies:
                r = client.request("DELETE", f"{base}/cache/objects", json=body)
                if r.status_code != 200 or not r.json().get("ok", False):
                    problems.append(f"LMCache DELETE /cache/objects ({body.get('adapter') or body['tier']}): "
                                    f"HTTP {r.status_code} {r.text[:160]}")
    except (httpx.HTTPError, ValueError) as exc:
        problems.append(f"LMCache DELETE /cache/objects: {exc}")
    return problems


def fs_object_size(info: ServerInfo) -> int | None:
    """Size in bytes of one object file of the server's first non-empty ``fs`` L2 (None: none),
    to check a KV layout against what LMCache really stores (files hold raw object bytes
    unless the adapter has a serde)."""
    for base in info.fs_paths:
        try:
            for entry in os.scandir(base):
                if entry.name.endswith(".data") and entry.is_file():
                    return Path(entry.path).stat().st_size
        except OSError:
            continue
    return None
