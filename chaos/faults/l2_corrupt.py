"""l2_corrupt: stored KV objects in the L2 tier are truncated, deleted or bit-flipped.

    filesystem L2 (x-kvchaos.l2_fs_path)       Redis L2 (x-kvchaos.redis.url)
      <model>@0x<kv_rank>@<group>@<chunk hash>[@<salt>].data   <model>@<kv_rank>@<group>@<hash>[@<salt>]
        truncate: file cut to half its size      truncate: value replaced by its first half (TTL kept)
        delete:   file unlinked                  delete:   DEL
        bitflip:  `bits` bits flipped in place   bitflip:  the same bits flipped with SETRANGE
                  within `byte_range`
        reads:    the file's atime moved past    reads:    GETs of the key in Redis' SLOWLOG
                  its corruption                           (threshold 0 while the fault is active)

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

Evidence counts *reads of corrupted objects*, not objects corrupted: corrupting an object nobody
reads tests nothing (a scenario whose corruption ran in a phase with no requests, while the reads
came after the heal, used to pass "bitten" with LMCache's load-failure count at 0 and 13 failed
GETs in its log). A read is seen, while the fault is active, (a) per object: a filesystem object
whose access time moved after it was corrupted (the L2 is mounted with atime updates: relatime,
the Linux default, updates it on the first read after a write), a Redis key that a client sent a
GET for (Redis' SLOWLOG, its threshold set to 0 while the fault is active and restored at heal);
(b) LMCache's own count of chunks its lookup found in L2 that then failed to load
(``lmcache_mp_l2_prefetch_failure_chunks_total``), which sees failed reads only; (c) for
``delete``, whose objects leave no access time to read, LMCache's own count of L2 lookups it made
while the objects were gone (``lmcache_mp_l2_prefetch_lookup_requests_total``: it asked its L2
for a request's chunks after the delete). With ``must_be_read`` (the default, for every mode) the
fault bit only when a read was seen: a delete that no lookup met tested nothing.

Default trigger (when the scenario declares none): that read (``read`` in the evidence), even
with ``must_be_read: false``; reads are observable through the fs L2's access times (not for
``delete``), Redis' SLOWLOG (``l2.redis``) or LMCache's /metrics (``lmcache.http``).
"""

from __future__ import annotations

import fnmatch
import os
import threading
import time
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field, model_validator

from chaos.duration import PositiveDuration
from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams
from chaos.faults.disk_full import LMCACHE_MARKER
from chaos.faults.kill import require_stack
from chaos.faults.registry import register
from chaos.prometheus import scrape_counters

__all__ = ["L2CorruptParams", "L2Corrupt", "RedisReadLog", "corrupt_file", "corrupt_redis_value", "pick_flips",
           "LOAD_FAILURES"]

#: LMCache 0.5.6 (v1/mp_observability/subscribers/metrics/l2_failures.py), as exported on /metrics.
LOAD_FAILURES = "lmcache_mp_l2_prefetch_failure_chunks_total"
#: LMCache 0.5.6's count of L2 prefetch lookups (its L2 asked for a request's chunks), on /metrics.
L2_LOOKUPS = "lmcache_mp_l2_prefetch_lookup_requests_total"

_FS_SUFFIX = ".data"


class L2CorruptParams(FaultParams):
    """Truncate, delete or bit-flip objects stored in the filesystem and/or Redis L2."""

    kind: Literal["l2_corrupt"]
    mode: Literal["truncate", "delete", "bitflip"] = Field(
        description="truncate: cut each object to half its bytes; delete: remove it; "
        "bitflip: flip `bits` bits within `byte_range` (silent corruption)"
    )
    bits: int = Field(
        default=1, ge=1, le=1 << 20,
        description="mode bitflip: how many distinct bits to flip in each object, at seeded positions "
        "within byte_range (one low mantissa bit rarely changes a greedy output; 64 or more usually do)",
    )
    byte_range: list[int] | None = Field(
        default=None, min_length=2, max_length=2,
        description="mode bitflip: [start, end) byte offsets of the object to flip bits in (end past the "
        "object's size is cut to it; an object shorter than start is left alone); default: the whole object",
    )
    must_be_read: bool | None = Field(
        default=None,
        description="the fault bit only when a corrupted object was read while the fault was active "
        "(default: true, for every mode; for delete, a read is an L2 lookup LMCache made after it)",
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
        # (by value, not by fields set: a journalled dump of the params carries the default)
        if self.mode != "bitflip" and (self.bits != 1 or self.byte_range is not None):
            raise ValueError("`bits` and `byte_range` are for mode bitflip only")
        if self.byte_range is not None:
            start, end = self.byte_range
            if start < 0 or end <= start:
                raise ValueError(f"byte_range must be [start, end) with 0 <= start < end, got {self.byte_range}")
        return self

    @property
    def reads_required(self) -> bool:
        """Whether the fault bites only when a corrupted object was read."""
        return True if self.must_be_read is None else self.must_be_read


FLIPS_SHOWN = 8  # flipped (offset, bit) pairs listed per object in the evidence


def pick_flips(size: int, rng: Any, bits: int = 1, byte_range: list[int] | None = None) -> list[tuple[int, int]]:
    """Which bits to flip in an object of ``size`` bytes: ``bits`` distinct (byte offset, bit)
    pairs, uniformly within ``byte_range`` ([start, end), cut to the object), sorted.

    Returns:
        the pairs; [] when the range holds no byte of the object.
    """
    start, end = byte_range if byte_range is not None else (0, size)
    end = min(end, size)
    if end <= start:
        return []
    positions = rng.sample(range(start * 8, end * 8), min(bits, (end - start) * 8))
    return sorted((p // 8, p % 8) for p in positions)


def _flipped(data: bytes, flips: list[tuple[int, int]], base: int) -> bytes:
    out = bytearray(data)
    for offset, bit in flips:
        out[offset - base] ^= 1 << bit
    return bytes(out)


def _flip_record(name: str, size: int, flips: list[tuple[int, int]]) -> dict[str, Any]:
    rec: dict[str, Any] = {"name": name, "size": size, "bits_flipped": len(flips),
                           "flips": [list(f) for f in flips[:FLIPS_SHOWN]]}
    if len(flips) == 1:  # the shape one-bit readers know
        rec["offset"], rec["bit"] = flips[0]
    return rec


def corrupt_file(path: Path, mode: str, rng: Any, *, bits: int = 1,
                 byte_range: list[int] | None = None) -> dict[str, Any] | None:
    """Corrupt one L2 file in place.

    Args:
        path: the object's file.
        mode: truncate | delete | bitflip.
        rng: a ``random.Random`` (which bits to flip).
        bits, byte_range: bitflip only: how many bits, within which [start, end) bytes.

    Returns:
        What was done (``{"name", "size", ...}``; bitflip: ``bits_flipped`` and the first
        ``flips`` as [offset, bit]), or None when the file vanished first, is empty, or (bitflip)
        is shorter than the range's start.
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
        flips = pick_flips(size, rng, bits, byte_range)
        if not flips:
            return None
        lo, hi = flips[0][0], flips[-1][0] + 1
        with open(path, "r+b") as f:
            f.seek(lo)
            old = f.read(hi - lo)
            f.seek(lo)
            f.write(_flipped(old, flips, lo))
        return _flip_record(path.name, size, flips)
    except FileNotFoundError:
        return None


def corrupt_redis_value(client: Any, key: bytes, mode: str, rng: Any, *, bits: int = 1,
                        byte_range: list[int] | None = None) -> dict[str, Any] | None:
    """Corrupt one Redis value in place (``client``: a ``redis.Redis``); as :func:`corrupt_file`.

    Returns:
        What was done, or None when the key vanished first, its value is empty, or (bitflip) it
        is shorter than the range's start.
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
    flips = pick_flips(size, rng, bits, byte_range)
    if not flips:
        return None
    lo, hi = flips[0][0], flips[-1][0] + 1
    client.setrange(key, lo, _flipped(value[lo:hi], flips, lo))
    return _flip_record(name, size, flips)


class RedisReadLog:
    """GETs of chosen Redis keys, from Redis' SLOWLOG with its threshold at 0 (every command
    logged, each argument cut to 128 bytes, so a 2 MiB SET costs little).

    Several faults on one Redis share the setting: the first to start saves the old threshold and
    length, the last to stop restores them. Keys are matched whole, or by their first bytes when
    Redis cut a long key ("... (N more bytes)").
    """

    _lock = threading.Lock()
    _users: dict[str, tuple[int, dict[str, str]]] = {}
    MAX_LEN = 65536

    def __init__(self, client: Any, url: str) -> None:
        self.client = client
        self.url = url
        self.last_id = -1
        self.reads: dict[str, int] = {}
        self.watched: set[str] = set()
        self.gap = False
        self.error: str | None = None
        self.started = False

    def start(self) -> None:
        """Set the threshold to 0 (remembering the old settings) and skip what is logged so far.

        Raises:
            redis.RedisError: CONFIG is refused (a managed Redis): reads are then not observed.
        """
        with self._lock:
            count, saved = self._users.get(self.url, (0, {}))
            if count == 0:
                saved = {k: v for k, v in self.client.config_get("slowlog-*").items()
                         if k in ("slowlog-log-slower-than", "slowlog-max-len")}
                self.client.config_set("slowlog-max-len", self.MAX_LEN)
                self.client.config_set("slowlog-log-slower-than", 0)
            self._users[self.url] = (count + 1, saved)
        newest = self.client.slowlog_get(1)
        self.last_id = newest[0]["id"] if newest else -1
        self.started = True

    def watch(self, names: list[str]) -> None:
        """Count GETs of these keys from now on (call before corrupting them)."""
        self.drain()
        self.watched.update(names)

    def drain(self) -> None:
        """Read what was logged since the last drain."""
        if not self.started:
            return
        entries = self.client.slowlog_get(10000)
        fresh = [e for e in entries if e["id"] > self.last_id]
        if fresh and entries and entries[-1]["id"] > self.last_id + 1 and len(entries) == 10000:
            self.gap = True  # more than 10000 commands since the last drain: some were not seen
        for e in sorted(fresh, key=lambda e: e["id"]):
            self.last_id = e["id"]
            who = e.get("client_name") or b""
            if (who.decode("utf-8", "replace") if isinstance(who, bytes) else who) == CLIENT_NAME:
                continue
            parts = (e.get("command") or b"").split(b" ")
            if not parts or parts[0].upper() not in (b"GET", b"MGET", b"GETEX", b"GETRANGE"):
                continue
            for raw in parts[1:]:
                key = raw.decode("utf-8", "replace")
                if "... (" in key:
                    key = key.split("... (")[0]
                    match = next((k for k in self.watched if k.startswith(key)), None)
                else:
                    match = key if key in self.watched else None
                if match is not None:
                    self.reads[match] = self.reads.get(match, 0) + 1

    def stop(self) -> None:
        """Last drain; the last user restores the saved settings."""
        if not self.started:
            return
        try:
            self.drain()
        finally:
            self.started = False
            with self._lock:
                count, saved = self._users.get(self.url, (1, {}))
                if count <= 1:
                    self._users.pop(self.url, None)
                    for k, v in saved.items():
                        self.client.config_set(k, v)
                else:
                    self._users[self.url] = (count - 1, saved)


#: The name our own Redis connection carries, so that its GETs are not counted as reads.
CLIENT_NAME = "kvchaos-l2-corrupt"


@register("l2_corrupt")
class L2Corrupt(Fault):
    """Corrupt what the L2 holds at apply (and every ``repeat_every`` while active); count the
    reads of what was corrupted while the fault is active."""

    params_model = L2CorruptParams

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """A corrupted (or deleted) object was read while the fault was active (``read`` in the
        evidence, whatever ``must_be_read`` says). A deleted file leaves no access time, so a
        delete needs Redis' SLOWLOG or LMCache's /metrics to see a read; other modes can also
        use the fs L2's access times."""
        mode = getattr(params, "mode", "")
        target = getattr(params, "target", "both")
        needs: frozenset[str] = frozenset()
        if mode == "delete":
            needs = frozenset({"lmcache.http|l2.redis"}) if target != "fs" else frozenset({"lmcache.http"})
        what = "deleted" if mode == "delete" else "corrupted"
        return DefaultTrigger("evidence", f"a {what} L2 object was read while the fault was active "
                              "(the fault's evidence)", needs=needs, evidence_field="read")

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
        self._considered = 0  # objects the passes have decided on (picked or spared)
        self._skipped = 0  # picked objects that vanished or were too short to corrupt
        self._passes = 0
        self._errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._metrics_url: str | None = None
        self._failures_before: float | None = None
        self._failures_after: float | None = None
        self._lookups_before: float | None = None
        self._lookups_after: float | None = None
        self._redis: Any = None
        self._redis_reads: RedisReadLog | None = None
        self._fs_path: Path | None = None
        self._fs_stamps: dict[str, tuple[int, int]] = {}  # name -> (inode, atime ns) after corruption
        self._fs_read: set[str] = set()
        self._fs_atime: bool | None = None

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
        """The new objects of this pass to corrupt: the same share of every pass.

        Each object is decided once, the first time a pass sees it; the count picked is what
        brings the objects corrupted so far to ``round(fraction * objects seen so far)`` (at least
        one once any matched), so ``repeat_every`` keeps the share at ``fraction`` instead of
        taking a fraction of what each pass finds left.
        """
        frac = 1.0 if self.params.fraction is None else self.params.fraction
        if frac >= 1.0 or not names:
            self._considered += len(names)
            return names
        picked_before = sum(len(v) for v in self._done.values()) + self._skipped
        self._considered += len(names)
        k = max(1, round(frac * self._considered)) - picked_before
        k = max(0, min(k, len(names)))
        return sorted(rng.sample(sorted(names), k))

    def _corrupt(self, target: str, name: str, ctx: FaultContext) -> None:
        p = self.params
        if target == "fs":
            assert self._fs_path is not None
            done = corrupt_file(self._fs_path / name, p.mode, ctx.rng, bits=p.bits, byte_range=p.byte_range)
            if done is not None and p.mode != "delete":
                try:
                    st = os.stat(self._fs_path / name)
                    self._fs_stamps[name] = (st.st_ino, st.st_atime_ns)
                except FileNotFoundError:
                    pass
        else:
            done = corrupt_redis_value(self._redis, name.encode(), p.mode, ctx.rng, bits=p.bits,
                                       byte_range=p.byte_range)
        if done is None:
            self._skipped += 1
        else:
            self._done[target].append(done)

    def _pass(self, ctx: FaultContext) -> int:
        """One corruption pass over both targets; returns objects corrupted in it."""
        with self._lock:
            before = sum(len(v) for v in self._done.values())
            if self._fs_path is not None:
                try:
                    names = [e.name for e in os.scandir(self._fs_path)
                             if e.name.endswith(_FS_SUFFIX) and e.is_file()]
                except FileNotFoundError:
                    names = []
                names = sorted(x for x in names if ("fs", x) not in self._seen and self._matches(x))
                self._seen.update(("fs", x) for x in names)
                for name in self._pick(names, ctx.rng):
                    self._corrupt("fs", name, ctx)
            if self._redis is not None:
                keys = [k for k in self._redis.scan_iter(count=1000)
                        if k.count(b"@") >= 3]  # LMCache's key shape: model@rank@group@hash[@salt]
                names = sorted(k.decode("utf-8", "replace") for k in keys)
                names = [x for x in names if ("redis", x) not in self._seen and self._matches(x)]
                self._seen.update(("redis", x) for x in names)
                chosen = self._pick(names, ctx.rng)
                if self._redis_reads is not None:
                    self._redis_reads.watch(chosen)
                for name in chosen:
                    self._corrupt("redis", name, ctx)
            self._passes += 1
            return sum(len(v) for v in self._done.values()) - before

    def _observe_fs_reads(self) -> None:
        """Objects whose access time moved since they were corrupted (same inode: a file LMCache
        wrote again under the same name is a new object, not a read of the corrupted one)."""
        if self._fs_path is None or not self._fs_atime:
            return
        for name, (ino, atime) in self._fs_stamps.items():
            if name in self._fs_read:
                continue
            try:
                st = os.stat(self._fs_path / name)
            except FileNotFoundError:
                continue
            if st.st_ino == ino and st.st_atime_ns > atime:
                self._fs_read.add(name)

    def _repeat(self, ctx: FaultContext, every: float | None) -> None:
        # Also drains the read logs once a second, so a long fault loses no read.
        tick = min(every, 1.0) if every is not None else 1.0
        next_pass = time.monotonic() + every if every is not None else None
        while not self._stop.wait(tick):
            try:
                if next_pass is not None and time.monotonic() >= next_pass:
                    self._pass(ctx)
                    next_pass = time.monotonic() + every  # type: ignore[operator]
                with self._lock:
                    self._observe_fs_reads()
                    if self._redis_reads is not None:
                        self._redis_reads.drain()
            except Exception as exc:  # keep going; reported at heal
                self._errors.append(f"{type(exc).__name__}: {exc}")

    def _load_failures(self, name: str = LOAD_FAILURES, labels: dict[str, str] | None = None) -> float | None:
        """LMCache's counter ``name`` (default: load failures, reason not_found); None when its
        /metrics cannot be read or are not LMCache's."""
        if self._metrics_url is None:
            return None
        if name == LOAD_FAILURES and labels is None:
            labels = {"reason": "not_found"}
        try:
            got = scrape_counters(self._metrics_url, [name], labels=labels)
            marker = scrape_counters(self._metrics_url, [LMCACHE_MARKER])[LMCACHE_MARKER]
        except (httpx.HTTPError, ValueError):
            return None
        if marker is None:
            return None  # not LMCache's metrics
        # OTel counters appear on their first increment: absent means none yet.
        return got[name] or 0.0

    # --- fault ---------------------------------------------------------------------------
    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Start watching reads, corrupt what the L2 holds now, start the repeat/drain thread.

        Raises:
            RuntimeError: no stack, or the stack lacks the L2 named by ``target``.
            redis.RedisError: Redis did not answer.
        """
        stack = require_stack(ctx)
        s = stack.settings
        self._fs_path, url = self._targets(s)
        if self._fs_path is not None:
            try:
                self._fs_atime = not (os.statvfs(self._fs_path).f_flag & os.ST_NOATIME)
            except FileNotFoundError:
                self._fs_atime = None
        if url is not None:
            try:
                import redis
            except ImportError:
                raise RuntimeError("l2_corrupt on the Redis L2 needs the `redis` package "
                                   "(pip install 'kvchaos[reference]')") from None
            self._redis = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5,
                                               client_name=CLIENT_NAME)
            log = RedisReadLog(self._redis, url)
            try:
                log.start()
                self._redis_reads = log
            except redis.RedisError as exc:
                self._errors.append(f"reads of Redis objects not observed: SLOWLOG settings refused ({exc})")
        self._metrics_url = f"{s.lmcache_http.rstrip('/')}/metrics" if s.lmcache_http else None
        self._failures_before = self._load_failures()
        if self.params.mode == "delete":
            self._lookups_before = self._load_failures(L2_LOOKUPS, {})
        n = self._pass(ctx)
        self._thread = threading.Thread(target=self._repeat, args=(ctx, self.params.repeat_every),
                                        name=f"l2_corrupt-{self.id}", daemon=True)
        self._thread.start()
        return {"mode": self.params.mode, "corrupted": n,
                "targets": [t for t, on in (("fs", self._fs_path), ("redis", url)) if on is not None]}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Stop repeating, take the last reading of the reads, restore Redis' SLOWLOG settings;
        nothing is restored in the L2 (LMCache must cope with what it finds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self._failures_after = self._load_failures()
        if self.params.mode == "delete":
            self._lookups_after = self._load_failures(L2_LOOKUPS, {})
        with self._lock:
            self._observe_fs_reads()
        if self._redis_reads is not None:
            try:
                self._redis_reads.stop()
            except Exception as exc:  # noqa: BLE001 - reported; the heal must finish
                self._errors.append(f"restoring Redis SLOWLOG settings: {type(exc).__name__}: {exc}")
        if self._redis is not None:
            self._redis.close()
        return {"restored": False, "passes": self._passes,
                "corrupted": {t: len(v) for t, v in self._done.items()}, "errors": self._errors[-5:]}

    def _reads(self) -> dict[str, Any]:
        """Reads of corrupted objects seen while the fault was active, per target (None: not
        observable there)."""
        fs: int | None = None
        if self._fs_path is not None and self.params.mode != "delete":
            fs = len(self._fs_read) if self._fs_atime else None
        redis_objects: int | None = None
        gets = 0
        if self._redis is not None:
            log = self._redis_reads
            if log is not None:
                redis_objects = len(log.reads)
                gets = sum(log.reads.values())
        return {"fs": fs, "redis": redis_objects, "redis_gets": gets,
                "redis_log_gap": bool(self._redis_reads and self._redis_reads.gap)}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when objects were corrupted and, with ``must_be_read`` (default for truncate and
        bitflip), at least one corrupted object was read while the fault was active: per object
        (fs access time, Redis GETs) or as a load failure LMCache counted (``reason="not_found"``:
        its lookup found a key in L2 whose load then returned no data)."""
        total = sum(len(v) for v in self._done.values())
        delta = None
        if self._failures_before is not None and self._failures_after is not None:
            delta = self._failures_after - self._failures_before
        reads = self._reads()
        seen = [v for v in (reads["fs"], reads["redis"]) if v is not None]
        objects_read = sum(seen) if seen else None
        lookups = None
        if self._lookups_before is not None and self._lookups_after is not None:
            lookups = self._lookups_after - self._lookups_before
        read = bool(objects_read) or bool(delta) or bool(lookups)
        required = self.params.reads_required
        out: dict[str, Any] = {"bit": total > 0 and (read or not required), "corrupted": total,
                               "by_target": {t: len(v) for t, v in self._done.items()},
                               "objects": [dict(o, target=t) for t, v in self._done.items() for o in v][:50],
                               "reads_of_corrupted": objects_read, "reads": reads,
                               "lmcache_load_failures": delta, "must_be_read": required, "read": read}
        if self.params.mode == "delete":
            out["lmcache_l2_lookups"] = lookups
        if total == 0:
            out["reason"] = "no stored object matched when the fault ran"
        elif required and not read:
            if objects_read is None and delta is None and lookups is None:
                out["reason"] = ("reads of the corrupted objects could not be observed (no atime on the fs L2, "
                                 "no Redis SLOWLOG, no LMCache /metrics)")
            else:
                out["reason"] = (f"{total} objects corrupted, none read while the fault was active: keep it "
                                 "active (until: end) in the phase whose requests load them")
        return out
