"""LMCache's L1 read locks that expired instead of being freed: a ledger in the server process.

LMCache 0.5.6 read-locks an L1 object for a lookup hit or a prefetch (``L1Manager.reserve_read``,
``finish_write_and_reserve_read``) and its holder frees it (``finish_read``, after the retrieve
or on ``free_lookup_locks``). A lock is a native ``TTLLock``: once ``--l1-read-ttl-seconds`` have
passed since its last ``lock()``, ``is_locked()`` answers False whatever its count, silently.
What LMCache exposes cannot tell such an expiry from a free:

- ``/status`` ``read_locked_count`` counts objects whose ``is_locked()`` is true: it drops to 0
  when the TTL expires exactly as when the holder frees (so with a 2 s TTL a lock the engine
  never freed is gone before the quiesce ends, and ``leaks`` passed);
- no counter or log line marks an expiry; the Prometheus counters (``lmcache_mp_l1_read``:
  chunks whose read finished) have no matching count of locks taken; the ``L1 read reserved /
  finished: N keys`` lines are DEBUG (``LMCACHE_LOG_LEVEL=DEBUG`` for the whole server); the
  WARNING "finish read on non-read-locked key" appears only when a holder frees after the
  expiry, never for a lock that no one frees.

So this module keeps the ledger LMCache lacks: per key, the read locks taken minus those freed
(each call's successful keys times its ``read_locks``), and adds to ``L1Manager.report_status``
(``/status`` ``storage_manager.l1_manager``):

- ``kvchaos_read_locks_taken`` / ``kvchaos_read_locks_freed``: totals since the server started;
- ``kvchaos_read_locks_freed_late``: frees that came after LMCache had let the lock go (the TTL
  passed first: LMCache answers ``KEY_IN_WRONG_STATE`` and logs "finish read on non-read-locked
  key"); the holder did free them, so they are freed, not leaked (an engine held longer than a
  short TTL, e.g. ``retrieve-dropped-slow-link``'s 6 s stall under a 2 s TTL, frees late);
- ``kvchaos_read_locks_held``: locks not freed on objects LMCache still holds locked;
- ``kvchaos_read_locks_expired``: locks no holder ever freed on objects LMCache no longer holds
  locked (the TTL expired, or the object was deleted under its lock): a lock that expired
  instead of being freed stays counted, on any TTL;
- ``kvchaos_read_locks_reclaimed``: ``freed_late + expired``, the locks LMCache let go before
  their holder freed them: the chunks a pending lookup (or a slow retrieve) had locked were
  reclaimed under it. It only grows while a lock expires (a late free moves a lock from
  expired to freed_late), so a trigger ``grew_by: 1`` on it proves that window.

It only observes: the wrapped methods are called unchanged and their results returned as they
are. Run it in place of LMCache's console script (compose/reference.yml's lmcache service)::

    python -m chaos.stack.lmcache_locks server --host 127.0.0.1 ...   # = lmcache server ...
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable, Iterable

#: The fields added to L1Manager.report_status.
FIELDS = ("kvchaos_read_locks_taken", "kvchaos_read_locks_freed", "kvchaos_read_locks_freed_late",
          "kvchaos_read_locks_held", "kvchaos_read_locks_expired", "kvchaos_read_locks_reclaimed")


class ReadLockLedger:
    """Read locks taken minus freed, per key (thread-safe; counts may go below 0 for a moment
    when a free is counted before the lock it frees, since each is counted after LMCache's call
    returns)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._open: dict[Any, int] = {}
        self.taken = 0
        self.freed = 0
        self.freed_late = 0

    def _add(self, keys: Iterable[Any], n: int) -> None:
        with self._mutex:
            for key in keys:
                left = self._open.get(key, 0) + n
                if left:
                    self._open[key] = left
                else:
                    self._open.pop(key, None)
                if n > 0:
                    self.taken += n
                else:
                    self.freed -= n

    def took(self, keys: Iterable[Any], n: int) -> None:
        """``n`` read locks taken on each of ``keys``."""
        self._add(keys, n)

    def released(self, keys: Iterable[Any], n: int, late: Iterable[Any] = ()) -> None:
        """``n`` read locks freed on each of ``keys``; ``late``: keys that LMCache had already let
        go (the TTL passed, or the object went) when the holder freed them. A late free counts
        only against a lock the ledger has open (a free of a key no one locked, as a replayed
        FREE_LOOKUP_LOCKS sends, frees nothing and must not hide a later leak of that key)."""
        late_keys = list(late)
        with self._mutex:
            real = [k for k in late_keys if self._open.get(k, 0) > 0]
            self.freed_late += n * len(real)
        skip = set(late_keys) - set(real)
        self._add([k for k in keys if k not in skip], -n)

    def report(self, is_locked: Callable[[Any], bool]) -> dict[str, int]:
        """The FIELDS, ``is_locked(key)`` telling whether LMCache still holds a key locked."""
        with self._mutex:
            open_ = [(k, n) for k, n in self._open.items() if n > 0]
            taken, freed, late = self.taken, self.freed, self.freed_late
        held = sum(n for k, n in open_ if is_locked(k))
        expired = sum(n for k, n in open_) - held
        return {"kvchaos_read_locks_taken": taken, "kvchaos_read_locks_freed": freed,
                "kvchaos_read_locks_freed_late": late, "kvchaos_read_locks_held": held,
                "kvchaos_read_locks_expired": expired, "kvchaos_read_locks_reclaimed": late + expired}


def install(manager_cls: type, success: Any, ledger: ReadLockLedger | None = None) -> ReadLockLedger:
    """Wrap ``manager_cls`` (LMCache's L1Manager) so that ``ledger`` counts its read locks.

    Args:
        manager_cls: ``lmcache.v1.distributed.l1_manager.L1Manager``.
        success: ``L1Error.SUCCESS`` (a key's result counts only when it is this).
        ledger: the ledger to fill (a new one when None).
    Returns:
        the ledger.
    """
    book = ledger or ReadLockLedger()

    def count(n: Any) -> int:
        try:
            return max(1, int(n))
        except (TypeError, ValueError):
            return 1

    def reserving(method: Callable) -> Callable:
        @functools.wraps(method)
        def wrapper(self, keys, *args, **kwargs):
            ret = method(self, keys, *args, **kwargs)
            n = count(kwargs.get("read_locks", args[0] if args else 1))
            book.took([k for k, r in ret.items() if r[0] == success], n)
            return ret
        return wrapper

    def finishing(method: Callable) -> Callable:
        @functools.wraps(method)
        def wrapper(self, keys, *args, **kwargs):
            ret = method(self, keys, *args, **kwargs)
            n = count(kwargs.get("read_locks", args[0] if args else 1))
            # Every key its holder frees counts as freed: LMCache refuses a free that comes
            # after the TTL (KEY_IN_WRONG_STATE) or after the object went (KEY_NOT_EXIST), but
            # the holder did free it; those are counted as late too.
            book.released(list(ret), n, late=[k for k, err in ret.items() if err != success])
            return ret
        return wrapper

    def reporting(method: Callable) -> Callable:
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            status = method(self, *args, **kwargs)

            def is_locked(key: Any) -> bool:
                entry = self._objects.get(key)
                return entry is not None and entry.read_lock.is_locked()

            if isinstance(status, dict):
                status.update(book.report(is_locked))
            return status
        return wrapper

    manager_cls.reserve_read = reserving(manager_cls.reserve_read)
    manager_cls.finish_write_and_reserve_read = reserving(manager_cls.finish_write_and_reserve_read)
    manager_cls.finish_read = finishing(manager_cls.finish_read)
    manager_cls.report_status = reporting(manager_cls.report_status)
    return book


def main(argv: list[str] | None = None) -> None:
    """Install the ledger in LMCache's L1Manager, then run LMCache's own CLI with ``argv``."""
    from lmcache.cli.main import main as lmcache_main
    from lmcache.v1.distributed.error import L1Error
    from lmcache.v1.distributed.l1_manager import L1Manager

    install(L1Manager, L1Error.SUCCESS)
    lmcache_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
