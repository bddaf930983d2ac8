"""l2_corrupt: stored KV objects in the L2 tier are truncated, deleted or bit-flipped.

    filesystem L2 (x-kvchaos.l2_fs_path)       Redis L2 (x-kvchaos.redis.url)
      <model>@0x<kv_rank>@<group>@<chunk hash>[@<salt>].data   <model>@<kv_rank>@<group>@<hash>[@<salt>]
        truncate: file cut to half its size      truncate: value replaced by its first half (TTL kept)
        delete:   file unlinked                  delete:   DEL
        bitflip:  one bit of one byte flipped    bitflip:  one bit flipped with SETRANGE

Names are those of LMCache 0.5.6: ``_object_key_to_filename`` in
``v1/distributed/l2_adapters/fs_l2_adapter.py`` and ``_object_key_to_string`` in
``native_connector_l2_adapter.py`` (the ``resp`` adapter stores each chunk's raw bytes with
SET). A truncated object gives a short read: the fs adapter logs "Incomplete read" and reports
the key not loaded, which the prefetch controller counts as an L2 prefetch failure (reason
``not_found``, ``lmcache_mp_l2_prefetch_failure_chunks_total``). A bit flip is silent (no
checksum): the engine is served wrong KV, which only the recompute-equivalence check can see.
Field reports F4 (truncated/deleted object after a positive lookup), F7 (file gone between
lookup and load).

Corruption is permanent: heal stops the repeat timer and reports what was hit.
"""

from __future__ import annotations

import fnmatch
import os
import threading
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field, model_validator

from chaos.faults.base import Fault, FaultContext, FaultParams
from chaos.faults.disk_full import LMCACHE_MARKER
from chaos.prometheus import scrape_counters
from chaos.faults.kill import require_stack
from chaos.faults.registry import register
from chaos.scenario.duration import PositiveDuration

__all__ = ["L2CorruptParams", "L2Corrupt", "corrupt_file", "corrupt_redis_value", "LOAD_FAILURES"]

#: LMCache 0.5.6 (v1/mp_observability/subscribers/metrics/l2_failures.py), as exported on /metrics.
LOAD_FAILURES = "lmcache_mp_l2_prefetch_failure_chunks_total"

_FS_SUFFIX = ".data"


class L2CorruptParams(FaultParams):
    """Truncate, delete or bit-flip objects stored in the filesystem and/or Redis L2."""

    kind: Literal["l2_corrupt"]
    mode: Literal["truncate", "delete", "bitflip"] = Field(
        description="truncate: cut each object to half its bytes; delete: remove it; "
        "bitflip: flip one bit of one byte (silent corruption)"
    )
    target: Literal["fs", "redis", "both"] = Field(
        default="both",
        description="which L2 to corrupt: fs (x-kvchaos.l2_fs_path), redis (x-kvchaos.redis), or "
        "both: every one of the two that the stack has",
    )
    fraction: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="fraction 0..1 of the matching objects to corrupt, picked with the scenario seed "
        "(default 1: all of them)",
    )
    key_selector: str | None = Field(
        default=None, min_length=1,
        description="glob on the file name (fs) or key (redis), e.g. '*@0x*@0@ab*'; default: every "
        "LMCache object",
    )
    repeat_every: PositiveDuration | None = Field(
        default=None,
        description="corrupt again at this interval while the fault is active, so objects stored "
        "during the fault are hit too",
    )

    @model_validator(mode="after")
    def _some_objects(self) -> L2CorruptParams:
        if self.fraction == 0.0:
            raise ValueError("fraction 0 corrupts nothing; give a fraction > 0")
        return self


def corrupt_file(path: Path, mode: str, rng: Any) -> dict[str, Any] | None:
    """Corrupt one L2 file in place.

    Args:
        path: the object's file.
        mode: truncate | delete | bitflip.
        rng: a ``random.Random`` (which byte and bit to flip).

    Returns:
        What was done (``{"name", "size", ...}``), or None when the file vanished first or is
        empty (nothing to truncate or flip).
    """
    try:
        size = path.stat().st_size
        if mode == "delete":
            path.unlink()
            return {"name": path.name, "size": size}
        if size == 0:
            return None
        if mode == "truncate":
            os.truncate(path, size // 2)
            return {"name": path.name, "size": size, "new_size": size // 2}
        offset, bit = rng.randrange(size), rng.randrange(8)
        with open(path, "r+b") as f:
            f.seek(offset)
            old = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([old ^ (1 << bit)]))
        return {"name": path.name, "size": size, "offset": offset, "bit": bit}
    except FileNotFoundError:
        return None


def corrupt_redis_value(client: Any, key: bytes, mode: str, rng: Any) -> dict[str, Any] | None:
    """Corrupt one Redis value in place (``client``: a ``redis.Redis``).

    Returns:
        What was done, or None when the key vanished first or its value is empty.
    """
    name = key.decode("utf-8", "replace")
    if mode == "delete":
        size = client.strlen(key)
        return {"name": name, "size": size} if client.delete(key) else None
    value = client.get(key)
    if not value:
        return None
    size = len(value)
    if mode == "truncate":
        # KEEPTTL: LMCache's TTL/eviction view of the key stays as it was.
        client.set(key, value[: size // 2], keepttl=True, xx=True)
        return {"name": name, "size": size, "new_size": size // 2}
    offset, bit = rng.randrange(size), rng.randrange(8)
    client.setrange(key, offset, bytes([value[offset] ^ (1 << bit)]))
    return {"name": name, "size": size, "offset": offset, "bit": bit}


@register("l2_corrupt")
class L2Corrupt(Fault):
    """Corrupt what the L2 holds at apply (and every ``repeat_every`` while active)."""

    params_model = L2CorruptParams

    @classmethod
    def capability_needs(cls, params: FaultParams) -> set[str]:
        """The L2 tier(s) ``target`` names; ``both`` needs at least one of them."""
        target = getattr(params, "target", "both")
        return {{"fs": "l2.fs", "redis": "l2.redis"}.get(target, "l2.fs|l2.redis")}
    params: L2CorruptParams

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._lock = threading.Lock()
        self._done: dict[str, list[dict[str, Any]]] = {"fs": [], "redis": []}
        self._seen: set[tuple[str, str]] = set()
        self._passes = 0
        self._errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._metrics_url: str | None = None
        self._failures_before: float | None = None
        self._failures_after: float | None = None
        self._redis: Any = None
        self._fs_path: Path | None = None

    # --- targets -------------------------------------------------------------------------
    def _targets(self, settings: Any) -> tuple[Path | None, str | None]:
        want = self.params.target
        fs = Path(settings.l2_fs_path) if settings.l2_fs_path else None
        url = settings.redis.url if settings.redis is not None else None
        if want == "fs" and fs is None:
            raise RuntimeError("l2_corrupt target fs needs x-kvchaos.l2_fs_path in the stack file")
        if want == "redis" and url is None:
            raise RuntimeError("l2_corrupt target redis needs x-kvchaos.redis.url in the stack file")
        if want == "both" and fs is None and url is None:
            raise RuntimeError("l2_corrupt needs an L2 in the stack file: x-kvchaos.l2_fs_path "
                               "and/or x-kvchaos.redis")
        return (fs if want in ("fs", "both") else None), (url if want in ("redis", "both") else None)

    def _matches(self, name: str) -> bool:
        sel = self.params.key_selector
        return sel is None or fnmatch.fnmatchcase(name, sel)

    def _pick(self, names: list[str], rng: Any) -> list[str]:
        frac = 1.0 if self.params.fraction is None else self.params.fraction
        if frac >= 1.0 or not names:
            return names
        # At least one object when any matches, so a small L2 is not spared by rounding.
        k = max(1, round(frac * len(names)))
        return sorted(rng.sample(sorted(names), k))

    def _pass(self, ctx: FaultContext) -> int:
        """One corruption pass over both targets; returns objects corrupted in it."""
        n = 0
        mode = self.params.mode
        with self._lock:
            if self._fs_path is not None:
                try:
                    names = [e.name for e in os.scandir(self._fs_path)
                             if e.name.endswith(_FS_SUFFIX) and e.is_file()]
                except FileNotFoundError:
                    names = []
                names = [x for x in names if ("fs", x) not in self._seen and self._matches(x)]
                for name in self._pick(names, ctx.rng):
                    done = corrupt_file(self._fs_path / name, mode, ctx.rng)
                    self._seen.add(("fs", name))
                    if done is not None:
                        self._done["fs"].append(done)
                        n += 1
            if self._redis is not None:
                keys = [k for k in self._redis.scan_iter(count=1000)
                        if k.count(b"@") >= 3]  # LMCache's key shape: model@rank@group@hash[@salt]
                names = sorted(k.decode("utf-8", "replace") for k in keys)
                names = [x for x in names if ("redis", x) not in self._seen and self._matches(x)]
                for name in self._pick(names, ctx.rng):
                    done = corrupt_redis_value(self._redis, name.encode(), mode, ctx.rng)
                    self._seen.add(("redis", name))
                    if done is not None:
                        self._done["redis"].append(done)
                        n += 1
            self._passes += 1
        return n

    def _repeat(self, ctx: FaultContext, every: float) -> None:
        while not self._stop.wait(every):
            try:
                self._pass(ctx)
            except Exception as exc:  # keep going; reported at heal
                self._errors.append(f"{type(exc).__name__}: {exc}")

    def _load_failures(self) -> float | None:
        if self._metrics_url is None:
            return None
        try:
            got = scrape_counters(self._metrics_url, [LOAD_FAILURES], labels={"reason": "not_found"})
            marker = scrape_counters(self._metrics_url, [LMCACHE_MARKER])[LMCACHE_MARKER]
        except (httpx.HTTPError, ValueError):
            return None
        if marker is None:
            return None  # not LMCache's metrics
        # OTel counters appear on their first increment: absent means none yet.
        return got[LOAD_FAILURES] or 0.0

    # --- fault ---------------------------------------------------------------------------
    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Corrupt what the L2 holds now; start the repeat timer when ``repeat_every`` is set.

        Raises:
            RuntimeError: no stack, or the stack lacks the L2 named by ``target``.
            redis.RedisError: Redis did not answer.
        """
        stack = require_stack(ctx)
        s = stack.settings
        self._fs_path, url = self._targets(s)
        if url is not None:
            try:
                import redis
            except ImportError:
                raise RuntimeError("l2_corrupt on the Redis L2 needs the `redis` package "
                                   "(pip install 'kvchaos[reference]')") from None
            self._redis = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        self._metrics_url = f"{s.lmcache_http.rstrip('/')}/metrics" if s.lmcache_http else None
        self._failures_before = self._load_failures()
        n = self._pass(ctx)
        if self.params.repeat_every is not None:
            self._thread = threading.Thread(target=self._repeat, args=(ctx, self.params.repeat_every),
                                            name=f"l2_corrupt-{self.id}", daemon=True)
            self._thread.start()
        return {"mode": self.params.mode, "corrupted": n,
                "targets": [t for t, on in (("fs", self._fs_path), ("redis", url)) if on is not None]}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Stop repeating; nothing is restored (LMCache must cope with what it finds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self._failures_after = self._load_failures()
        if self._redis is not None:
            self._redis.close()
        return {"restored": False, "passes": self._passes,
                "corrupted": {t: len(v) for t, v in self._done.items()}, "errors": self._errors[-5:]}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when at least one object was corrupted. LMCache's count of chunks that failed to
        load from L2 (``reason="not_found"``: the adapter returned no data for a key its lookup
        had found) is reported as a delta when its /metrics answered at apply and heal."""
        total = sum(len(v) for v in self._done.values())
        delta = None
        if self._failures_before is not None and self._failures_after is not None:
            delta = self._failures_after - self._failures_before
        out: dict[str, Any] = {"bit": total > 0, "corrupted": total,
                               "by_target": {t: len(v) for t, v in self._done.items()},
                               "objects": [dict(o, target=t) for t, v in self._done.items() for o in v][:50],
                               "lmcache_load_failures": delta}
        if total == 0:
            out["reason"] = "no stored object matched when the fault ran"
        return out
