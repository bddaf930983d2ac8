"""Read locks that a TTL freed instead of their holder: the ledger the reference stack's LMCache
server keeps (chaos/stack/lmcache_locks.py), and how leaks reports it."""

import time

from chaos.checks import LeakSample, Snapshots, leaks
from chaos.stack.lmcache_locks import ReadLockLedger, install


def test_leaks_names_locks_that_expired_instead_of_being_freed():
    snap = Snapshots(
        leak_samples=[LeakSample(source="lmcache", time=10, values={"read_locked_count": 0}),
                      LeakSample(source="lmcache-lock-ledger", time=10, values={"read_locks_expired": 1})],
        leak_baselines={"lmcache-lock-ledger": {"read_locks_expired": 0}}, quiesce_waited_s=0.5)
    r = leaks.check([], snap, {})
    assert r.verdict == "failed"
    assert r.summary == ("1 lock(s) expired by a TTL instead of being freed: "
                         "lmcache-lock-ledger.read_locks_expired=1 (baseline 0)")
    assert r.details["expired"][0]["field"] == "read_locks_expired"


def test_expired_count_from_an_earlier_run_on_the_same_server_is_its_baseline():
    snap = Snapshots(
        leak_samples=[LeakSample(source="lmcache-lock-ledger", time=10, values={"read_locks_expired": 3})],
        leak_baselines={"lmcache-lock-ledger": {"read_locks_expired": 3}})
    assert leaks.check([], snap, {}).verdict == "passed"


class _Entry:
    def __init__(self, ttl_s: int) -> None:
        from lmcache.lmcache_native import TTLLock  # LMCache's own lock, as its L1Manager holds it

        self.read_lock = TTLLock(ttl_s)


class _Store:
    """The part of LMCache's L1Manager the ledger wraps: the same method names, signatures and
    result shapes (key -> (error, obj) for reservations, key -> error for frees)."""

    OK = "SUCCESS"

    def __init__(self, ttl_s: int) -> None:
        self._objects = {k: _Entry(ttl_s) for k in ("a", "b", "c")}

    def _lock(self, keys, read_locks):
        out = {}
        for k in keys:
            for _ in range(read_locks):
                self._objects[k].read_lock.lock()
            out[k] = (self.OK, object())
        return out

    def reserve_read(self, keys, read_locks=1):
        return self._lock(keys, read_locks)

    def finish_write_and_reserve_read(self, keys, read_locks=1, tag=""):
        return self._lock(keys, read_locks)

    def finish_read(self, keys, read_locks=1):
        out = {}
        for k in keys:
            if not self._objects[k].read_lock.is_locked():
                out[k] = "KEY_IN_WRONG_STATE"
                continue
            for _ in range(read_locks):
                self._objects[k].read_lock.unlock()
            out[k] = self.OK
        return out

    def report_status(self):
        return {"read_locked_count": sum(e.read_lock.is_locked() for e in self._objects.values())}


def _ledgered_store(ttl_s: int) -> _Store:
    """A store whose class (a fresh subclass: each test its own ledger) has the ledger installed."""
    cls = type("_LedgeredStore", (_Store,), {})
    install(cls, _Store.OK, ReadLockLedger())
    return cls(ttl_s)


def test_ledger_counts_a_lock_never_freed_as_expired_once_the_ttl_passed():
    store = _ledgered_store(ttl_s=1)
    store.reserve_read(["a", "b"])
    store.finish_write_and_reserve_read(["c"], 2)
    store.finish_read(["a"])
    store.finish_read(["c"], read_locks=2)
    st = store.report_status()
    assert st["read_locked_count"] == 1 and st["kvchaos_read_locks_held"] == 1
    assert st["kvchaos_read_locks_expired"] == 0 and st["kvchaos_read_locks_taken"] == 4
    assert st["kvchaos_read_locks_reclaimed"] == 0
    time.sleep(1.3)  # b's TTL passes: LMCache forgets the lock, the ledger does not
    st = store.report_status()
    assert st["read_locked_count"] == 0
    assert st["kvchaos_read_locks_expired"] == 1 and st["kvchaos_read_locks_held"] == 0
    assert st["kvchaos_read_locks_freed_late"] == 0 and st["kvchaos_read_locks_reclaimed"] == 1
    store.finish_read(["b"])  # its holder frees it after all: LMCache refuses (expired), yet freed
    st = store.report_status()
    assert st["kvchaos_read_locks_expired"] == 0 and st["kvchaos_read_locks_freed_late"] == 1
    assert st["kvchaos_read_locks_reclaimed"] == 1  # reclaimed under its holder all the same: it stays


def test_a_free_of_a_key_no_one_locked_does_not_hide_a_later_leak():
    store = _ledgered_store(ttl_s=1)
    store.finish_read(["a"])  # a replayed free for a lookup the server never made: nothing to free
    st = store.report_status()
    assert st["kvchaos_read_locks_freed"] == 0 and st["kvchaos_read_locks_freed_late"] == 0
    store.reserve_read(["a"])  # then a real lock on the same key, never freed
    time.sleep(1.3)
    assert store.report_status()["kvchaos_read_locks_expired"] == 1
