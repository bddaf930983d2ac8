"""disk_full: the filesystem L2 runs out of space (ENOSPC on every store).

    x-kvchaos.l2_fs_path ── a tmpfs of x-kvchaos.l2_fs_size (mounted by the stack)
        apply: kvchaos-ballast-<fault id>.fill written until ENOSPC (journalled first, kind
               ``file``, so ``kvchaos cleanup`` deletes it after a killed run)
        heal:  ballast deleted

Only a size-capped mount can be filled safely: on an ordinary folder the ballast would fill
the host's disk (field report F6: an uncapped L2 filled the node until pods were evicted).

Evidence comes from LMCache itself. LMCache 0.5.6's MP server publishes an
``L2_STORE_COMPLETED`` event per store task, with ``failed_count`` set and no per-salt key
counts when the adapter failed (``v1/distributed/storage_controllers/store_controller.py``,
``_finalize_store``); its metrics subscriber (``v1/mp_observability/subscribers/metrics/l2.py``)
counts submitted chunks and chunks stored, exported on the HTTP port's ``/metrics`` as
``lmcache_mp_l2_store_submitted_objects_chunks_total`` and
``lmcache_mp_l2_store_completed_objects_chunks_total``. Chunks submitted but not stored while
the fault was in place = failed L2 stores. The fs adapter fails a store when its write raises
(``fs_l2_adapter.py``, ``_execute_store``: "FSL2Adapter failed to store"). When the stack has no
``lmcache_http`` or its ``/metrics`` lacks those counters, the evidence falls back to the
filesystem ("ENOSPC hit and the filesystem still full at heal") and says so in ``source``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Literal

import httpx

from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams
from chaos.faults.kill import require_stack
from chaos.faults.registry import register
from chaos.prometheus import scrape_counters

__all__ = ["DiskFullParams", "DiskFull", "fill_until_enospc",
           "STORE_SUBMITTED", "STORE_COMPLETED", "LMCACHE_MARKER"]

STORE_SUBMITTED = "lmcache_mp_l2_store_submitted_objects_chunks_total"
STORE_COMPLETED = "lmcache_mp_l2_store_completed_objects_chunks_total"
#: A gauge LMCache's MP server exports from its start (OTel counters appear only after their
#: first increment): when it is there, a missing store counter means 0.
LMCACHE_MARKER = "lmcache_mp_l2_store_adapters"

#: Write sizes for the ballast, largest first: big writes fill fast, the small ones take the
#: last free pages of the tmpfs.
_WRITE_SIZES = (1 << 20, 64 << 10, 4 << 10, 512, 1)


def fill_until_enospc(path: Path) -> tuple[int, bool]:
    """Append to ``path`` until the filesystem refuses with ENOSPC.

    Returns:
        (bytes written, whether ENOSPC was hit).

    Raises:
        OSError: any error other than ENOSPC.
    """
    written = 0
    hit = False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in _WRITE_SIZES:
            block = b"\0" * size
            while True:
                try:
                    n = os.write(fd, block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    hit = True
                    break
                written += n
                if n < size:  # a short write: the next one fails with ENOSPC
                    continue
        os.fsync(fd)
    finally:
        os.close(fd)
    return written, hit


class DiskFullParams(FaultParams):
    """Fill the stack's size-capped filesystem L2 to ENOSPC until heal (no fields of its own)."""

    kind: Literal["disk_full"]


@register("disk_full")
class DiskFull(Fault):
    """Fill the stack's size-capped filesystem L2 with a ballast file; delete it at heal."""

    params_model = DiskFullParams
    needs = ("l2.fs", "l2.fs.size_cap")
    params: DiskFullParams

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """LMCache counted L2 stores that failed while the disk was full (its /metrics; a full
        filesystem alone does not show that a store met it)."""
        return DefaultTrigger("evidence", "LMCache counted L2 stores that failed while the disk was full "
                              "(its /metrics)", needs=frozenset({"lmcache.http"}),
                              evidence_field="failed_store_chunks")

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._ballast: Path | None = None
        self._bytes = 0
        self._enospc = False
        self._free_at_apply: int | None = None
        self._free_at_heal: int | None = None
        self._before: dict[str, float | None] | None = None
        self._after: dict[str, float | None] | None = None
        self._metrics_error: str | None = None
        self._metrics_url: str | None = None

    def ballast_path(self, l2_fs_path: str) -> Path:
        """Where the ballast goes: ``<l2_fs_path>/kvchaos-ballast-<fault id>.fill`` (not a
        ``.data`` name, so LMCache's fs adapter never takes it for a KV object)."""
        return Path(l2_fs_path) / f"kvchaos-ballast-{self.id}.fill"

    def _counters(self) -> dict[str, float | None] | None:
        if self._metrics_url is None:
            return None
        try:
            got = scrape_counters(self._metrics_url, [STORE_SUBMITTED, STORE_COMPLETED, LMCACHE_MARKER])
        except (httpx.HTTPError, ValueError) as exc:
            self._metrics_error = f"{type(exc).__name__}: {exc}"
            return None
        if got.pop(LMCACHE_MARKER) is None:
            return got  # not LMCache's metrics: absent counters stay None
        return {k: (v or 0.0) for k, v in got.items()}

    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Write the ballast until ENOSPC.

        Raises:
            RuntimeError: no stack; the stack has no ``l2_fs_path``, or it is not a mount point
                (``x-kvchaos.l2_fs_size`` not set); the filesystem never reported ENOSPC.
        """
        stack = require_stack(ctx)
        s = stack.settings
        if not s.l2_fs_path:
            raise RuntimeError("disk_full needs the stack's filesystem L2: set x-kvchaos.l2_fs_path "
                               "(and x-kvchaos.l2_fs_size) in the stack file")
        if not os.path.ismount(s.l2_fs_path):
            raise RuntimeError(f"the stack's filesystem L2 is not a size-capped mount: set "
                               f"x-kvchaos.l2_fs_size (e.g. 64m) in the stack file ({s.l2_fs_path} is "
                               "a plain folder; filling it would fill the host's disk)")
        self._metrics_url = f"{s.lmcache_http.rstrip('/')}/metrics" if s.lmcache_http else None
        self._before = self._counters()
        path = self.ballast_path(s.l2_fs_path)
        stack.journal.add("file", str(path), path=str(path))
        self._ballast = path
        self._bytes, self._enospc = fill_until_enospc(path)
        self._free_at_apply = _free_bytes(s.l2_fs_path)
        if not self._enospc:
            raise RuntimeError(f"wrote {self._bytes} bytes to {path} without ENOSPC")
        return {"ballast": str(path), "ballast_bytes": self._bytes, "enospc": True,
                "free_bytes": self._free_at_apply}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Read LMCache's counters, then delete the ballast (and its journal entry)."""
        path = self._ballast
        if path is None:
            return {"removed": False, "reason": "no ballast was written"}
        self._free_at_heal = _free_bytes(str(path.parent))
        self._after = self._counters()
        removed = False
        try:
            path.unlink()
            removed = True
        except FileNotFoundError:
            pass
        if ctx.stack is not None:
            ctx.stack.journal.remove("file", str(path))
        return {"ballast": str(path), "removed": removed, "free_bytes_before_removal": self._free_at_heal}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Bit when LMCache counted L2 stores that failed while the disk was full (the delta of
        submitted minus stored chunks between apply and heal); without LMCache's counters, when
        ENOSPC was hit and the filesystem was still full at heal."""
        b, a = self._before or {}, self._after or {}
        if all(x.get(n) is not None for x in (b, a) for n in (STORE_SUBMITTED, STORE_COMPLETED)):
            submitted = a[STORE_SUBMITTED] - b[STORE_SUBMITTED]  # type: ignore[operator]
            stored = a[STORE_COMPLETED] - b[STORE_COMPLETED]  # type: ignore[operator]
            failed = submitted - stored
            out: dict[str, Any] = {"bit": failed > 0, "source": "lmcache /metrics",
                                   "failed_store_chunks": failed, "submitted_chunks": submitted,
                                   "stored_chunks": stored, "ballast_bytes": self._bytes}
            if failed <= 0:
                out["reason"] = ("no L2 store was attempted while the disk was full" if submitted <= 0
                                 else "every L2 store succeeded")
            return out
        full = self._free_at_heal is not None and self._free_at_heal < 4096
        why = self._metrics_error or ("the stack has no x-kvchaos.lmcache_http" if self._metrics_url is None
                                      else "LMCache's /metrics has no L2 store counters")
        return {"bit": bool(self._enospc and full), "source": f"filesystem ({why})",
                "enospc": self._enospc, "free_bytes_at_heal": self._free_at_heal,
                "ballast_bytes": self._bytes}


def _free_bytes(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize

