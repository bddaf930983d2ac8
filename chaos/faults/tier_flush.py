"""tier_flush: a cache tier loses what it holds (L1 emptied, the Redis L2 flushed, the fs L2 emptied).

    engine POST <engine_url>/reset_prefix_cache     (the engine's own prefix cache; vLLM's route)
    l1     POST <lmcache_http>/cache/clear {"tier": "l1", "force": <force>}   (LMCache's own API)
    redis  FLUSHALL on x-kvchaos.redis.url
    fs     every LMCache object file (*.data) under x-kvchaos.l2_fs_path unlinked

A flush happens once, at apply; nothing comes back at heal. The fault stays "in place" for its
``duration`` so that its ``trigger`` can watch what the flush leads to (later loads must come
from L2, or miss everywhere).

Evidence is measured at apply, right around the flush, so requests that store new chunks
afterwards cannot spoil it (issue 11: a later "L1 holds 0 objects" snapshot was broken by
concurrent stores):

- L1: LMCache 0.5.6's clear (``L1Manager.clear``, ``v1/distributed/l1_manager.py``) frees every
  resident object that is not read-locked (with ``force``: every object and every staging
  object) and publishes them as ``L1_KEYS_EVICTED``, which its metrics subscriber
  (``v1/mp_observability/subscribers/metrics/l1.py``) counts on ``/metrics`` as
  ``lmcache_mp_l1_evicted_chunks_total``. The counter's increase across the clear call is the
  number of chunks the flush removed; the event bus is asynchronous, so it is read until it
  reaches what ``/status`` said L1 held (or 3 s pass). Without that counter: ``/status``'s
  ``storage_manager.l1_manager.total_object_count`` fell.
- Redis: ``DBSIZE`` before the flush (keys removed) and after.
- fs: the files unlinked.
- engine: the reference engine's ``/debug/state`` ``prefix_cache_blocks`` before (> 0) and
  after (0); an engine without that state (vLLM) only says the reset answered 2xx.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

import httpx
from pydantic import Field, field_validator

from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams
from chaos.faults.kill import require_stack
from chaos.faults.registry import register
from chaos.probes import ProbeError, json_at, read_metric

__all__ = ["TierFlushParams", "TierFlush", "L1_EVICTED", "flush_engine", "flush_l1", "flush_redis", "flush_fs"]

#: LMCache 0.5.6: chunks removed from L1 (evictions and clears), on the HTTP port's /metrics.
L1_EVICTED = "lmcache_mp_l1_evicted_chunks_total"
#: How long apply waits for LMCache's (asynchronous) counter to show the clear, seconds.
COUNTER_WAIT_S = 3.0

_L1 = "storage_manager.l1_manager"


class TierFlushParams(FaultParams):
    """Empty one or more cache tiers at apply."""

    kind: Literal["tier_flush"]
    tiers: list[Literal["engine", "l1", "fs", "redis"]] = Field(
        default_factory=lambda: ["l1"], min_length=1,
        description="the tiers to empty: engine (the engine's own prefix cache, POST /reset_prefix_cache), "
        "l1 (LMCache's CPU memory, via its POST /cache/clear), redis (the Redis L2: FLUSHALL), fs (the "
        "filesystem L2's object files); default [l1]",
    )
    force: bool = Field(
        default=False,
        description="l1: also remove read-locked and staging objects (LMCache's force flag; "
        "in-flight loads and stores may break)",
    )

    @field_validator("tiers")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"a tier is listed twice: {v}")
        return v


def _l1_status(client: httpx.Client, base: str) -> dict[str, float]:
    r = client.get(f"{base}/status", timeout=10)
    r.raise_for_status()
    l1 = json_at(r.json(), _L1)
    return {k: float(l1.get(k) or 0) for k in
            ("total_object_count", "read_locked_count", "staging_object_count", "write_locked_count")}


def _evicted(client: httpx.Client, base: str) -> float | None:
    try:
        value, seen = read_metric(f"{base}/metrics", L1_EVICTED, client=client)
    except ProbeError:
        return None
    if not seen:
        # OTel counters appear on their first increment: 0 when this is LMCache's /metrics.
        try:
            _, lmcache = read_metric(f"{base}/metrics", "lmcache_mp_l2_store_adapters", client=client)
        except ProbeError:
            return None
        return 0.0 if lmcache else None
    return value


def flush_l1(lmcache_http: str, force: bool = False) -> dict[str, Any]:
    """Clear LMCache's L1 through its HTTP API and measure what the clear removed.

    Returns:
        ``{"bit", "source", "removed_chunks", "held_before", "locked_before", "staging_before",
        "total_after", ...}``; ``bit`` True when the clear removed at least one object.

    Raises:
        httpx.HTTPError: /status or /cache/clear did not answer 2xx.
    """
    base = lmcache_http.rstrip("/")
    with httpx.Client() as client:
        before = _l1_status(client, base)
        evicted0 = _evicted(client, base)
        r = client.post(f"{base}/cache/clear", json={"tier": "l1", "force": force}, timeout=30)
        r.raise_for_status()
        after = _l1_status(client, base)
        held = before["total_object_count"] - before["staging_object_count"]
        expect = held if force else held - before["read_locked_count"]
        removed: float | None = None
        if evicted0 is not None:
            deadline = time.monotonic() + COUNTER_WAIT_S
            while True:
                now = _evicted(client, base)
                removed = None if now is None else now - evicted0
                if removed is None or removed >= max(expect, 1) or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
    out: dict[str, Any] = {"held_before": before["total_object_count"], "locked_before": before["read_locked_count"],
                           "staging_before": before["staging_object_count"], "total_after": after["total_object_count"],
                           "locked_after": after["read_locked_count"], "force": force,
                           "answer": r.json() if r.headers.get("content-type", "").startswith("application/json")
                           else r.text[:200]}
    if removed is not None:
        out.update(source=f"lmcache /metrics {L1_EVICTED}", removed_chunks=removed, bit=removed >= 1)
    else:
        fell = before["total_object_count"] - after["total_object_count"]
        out.update(source="lmcache /status total_object_count", removed_chunks=max(fell, 0.0), bit=fell >= 1)
    if not out["bit"]:
        out["reason"] = ("L1 held nothing at apply" if before["total_object_count"] == 0
                         else "the clear removed nothing (every object locked?)")
    return out


def flush_redis(url: str) -> dict[str, Any]:
    """``FLUSHALL`` the Redis L2 at ``url``.

    Returns:
        ``{"bit", "keys_before", "keys_after"}``; bit when there was a key to remove.

    Raises:
        RuntimeError: the ``redis`` package is missing; redis.RedisError: Redis did not answer.
    """
    try:
        import redis
    except ImportError:
        raise RuntimeError("tier_flush of redis needs the `redis` package "
                           "(pip install 'kvchaos[reference]')") from None
    client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
    try:
        before = int(client.dbsize())
        client.flushall()
        after = int(client.dbsize())
    finally:
        client.close()
    out: dict[str, Any] = {"bit": before >= 1, "source": "redis DBSIZE", "keys_before": before, "keys_after": after}
    if before == 0:
        out["reason"] = "Redis held no key at apply"
    return out


def _prefix_blocks(client: httpx.Client, engine_url: str) -> float | None:
    try:
        r = client.get(f"{engine_url}/debug/state", timeout=10)
        if r.status_code != 200:
            return None
        value = r.json().get("prefix_cache_blocks")
    except (httpx.HTTPError, ValueError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def flush_engine(engine_url: str) -> dict[str, Any]:
    """Empty the engine's own prefix cache (``POST /reset_prefix_cache``, vLLM's route).

    Returns:
        ``{"bit", "source", "blocks_before", "blocks_after"}``: with the reference engine's
        ``/debug/state``, bit when it held blocks and holds none after; without it, bit when the
        reset answered 2xx.

    Raises:
        httpx.HTTPError: the reset did not answer 2xx.
    """
    base = engine_url.rstrip("/")
    with httpx.Client() as client:
        before = _prefix_blocks(client, base)
        client.post(f"{base}/reset_prefix_cache", timeout=30).raise_for_status()
        after = _prefix_blocks(client, base)
    if before is None or after is None:
        return {"bit": True, "source": "engine POST /reset_prefix_cache answered 2xx (no /debug/state)"}
    out: dict[str, Any] = {"bit": before >= 1 and after == 0, "source": "engine /debug/state prefix_cache_blocks",
                           "blocks_before": before, "blocks_after": after}
    if before < 1:
        out["reason"] = "the engine's prefix cache held nothing at apply (is prefix caching on?)"
    elif after != 0:
        out["reason"] = f"{after:g} blocks still cached after the reset"
    return out


def flush_fs(path: str | Path) -> dict[str, Any]:
    """Unlink every LMCache object file (``*.data``) directly under ``path``.

    Returns:
        ``{"bit", "files_removed", "bytes_removed"}``.
    """
    removed, size = 0, 0
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        entries = []
    for e in entries:
        if not (e.name.endswith(".data") and e.is_file()):
            continue
        try:
            n = e.stat().st_size
            os.unlink(e.path)
        except FileNotFoundError:
            continue
        removed += 1
        size += n
    out: dict[str, Any] = {"bit": removed >= 1, "source": "filesystem", "files_removed": removed,
                           "bytes_removed": size}
    if removed == 0:
        out["reason"] = f"no object file under {path} at apply"
    return out


@register("tier_flush")
class TierFlush(Fault):
    """Empty the named tiers at apply; evidence per tier, measured around the flush."""

    params_model = TierFlushParams
    params: TierFlushParams
    #: What each tier's flush calls (chaos/stack/capabilities.py).
    TIER_NEEDS: ClassVar[dict[str, str]] = {"engine": "engine.reset_prefix_cache", "l1": "lmcache.http",
                                            "redis": "l2.redis", "fs": "l2.fs"}

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """A request of the workload was in flight at the flush or sent after it (this phase or a
        later one): its lookup met the emptied tier."""
        return DefaultTrigger("requests_from_apply", "a request of the workload was in flight at the flush or "
                              "sent after it, so its lookup met the emptied tier")

    @classmethod
    def capability_needs(cls, params: FaultParams) -> set[str]:
        """One capability per tier in ``tiers``: ``engine.reset_prefix_cache``, ``lmcache.http``,
        ``l2.redis``, ``l2.fs``."""
        assert isinstance(params, TierFlushParams)
        return {cls.TIER_NEEDS[t] for t in params.tiers}

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._done: dict[str, dict[str, Any]] = {}
        self._errors: dict[str, str] = {}

    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Flush every tier in ``tiers``, in order.

        Raises:
            RuntimeError: no stack, or it lacks a tier asked for (``lmcache_http``, ``redis``,
                ``l2_fs_path``); httpx.HTTPError / redis.RedisError: the tier did not answer.
        """
        s = require_stack(ctx).settings
        need = {"l1": ("lmcache_http", s.lmcache_http), "redis": ("redis", s.redis),
                "fs": ("l2_fs_path", s.l2_fs_path), "engine": ("engine_url", s.engine_url)}
        missing = [f"{t} (x-kvchaos.{need[t][0]})" for t in self.params.tiers if not need[t][1]]
        if missing:
            raise RuntimeError(f"tier_flush: the stack has no {', '.join(missing)}")
        for tier in self.params.tiers:
            if tier == "l1":
                self._done[tier] = flush_l1(s.lmcache_http, self.params.force)
            elif tier == "redis":
                self._done[tier] = flush_redis(s.redis.url)
            elif tier == "engine":
                self._done[tier] = flush_engine(s.engine_url)
            else:
                self._done[tier] = flush_fs(s.l2_fs_path)
        return {"tiers": {t: {k: v for k, v in d.items() if k != "answer"} for t, d in self._done.items()}}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Nothing to undo: what was flushed stays gone."""
        return {"restored": False}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when every tier asked for had something removed by the flush."""
        done = self._done
        bit = bool(done) and all(d.get("bit") is True for d in done.values()) and len(done) == len(self.params.tiers)
        out: dict[str, Any] = {"bit": bit, "tiers": done}
        if not bit:
            dull = [t for t in self.params.tiers if not done.get(t, {}).get("bit")]
            out["reason"] = "; ".join(f"{t}: {done.get(t, {}).get('reason', 'not flushed')}" for t in dull)
        return out
