"""tier_flush against the reference stack's storage side as real processes (LMCache MP server,
Redis through the fault proxy, the fs L2 on its tmpfs), filled by LMCache's own CPU client
(`lmcache bench server --mode cpu`): the flush is proven by LMCache's counters, read around
the clear call, and by the L2 tiers themselves."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from chaos.faults.base import FaultContext
from kvchaos_support import fault, lmcache_bench as bench, needs_lmcache, needs_redis, needs_root

pytestmark = [pytest.mark.slow, needs_lmcache, needs_redis, needs_root]


def l1_objects(stack) -> int:
    st = httpx.get(f"{stack.settings.lmcache_http}/status", timeout=10).json()
    return st["storage_manager"]["l1_manager"]["total_object_count"]


def redis_keys(stack) -> int:
    import redis

    return int(redis.Redis.from_url(stack.settings.redis.url).dbsize())


def fs_objects(stack) -> int:
    return len(list(Path(stack.settings.l2_fs_path).glob("*.data")))


def test_flush_every_tier_proven_by_lmcache_and_the_tiers(reference_storage):
    bench(reference_storage)
    s = reference_storage
    assert l1_objects(s) >= 2 and redis_keys(s) >= 2 and fs_objects(s) >= 2
    held = l1_objects(reference_storage)
    f = fault("tier_flush", tiers=["l1", "redis", "fs"])
    ctx = FaultContext(stack=reference_storage)
    f.apply(ctx)
    assert l1_objects(s) == 0 and redis_keys(s) == 0 and fs_objects(s) == 0
    assert f.heal(ctx) == {"restored": False}
    ev = f.evidence(ctx)
    assert ev["bit"] is True, ev
    l1 = ev["tiers"]["l1"]
    assert l1["source"].startswith("lmcache /metrics lmcache_mp_l1_evicted_chunks_total")
    assert l1["removed_chunks"] == held == l1["held_before"]
    assert ev["tiers"]["redis"]["keys_before"] >= 2 and ev["tiers"]["fs"]["files_removed"] >= 2


def test_l1_flush_then_the_prefix_is_loaded_from_l2(reference_storage):
    """What the flush is for: the next lookup of the same tokens is an L2 hit, which LMCache
    counts (the trigger a scenario declares on it)."""
    from chaos.probes import Condition, TriggerWatch

    bench(reference_storage)
    f = fault("tier_flush", tiers=["l1"])
    watch = TriggerWatch([Condition(metric="lmcache_mp_lookup_hit_l2_tokens_total", service="lmcache",
                                    grew_by=512)], reference_storage)
    watch.begin()
    ctx = FaultContext(stack=reference_storage)
    f.apply(ctx)
    watch.start()
    bench(reference_storage)
    got = watch.finish()
    assert f.evidence(ctx)["bit"] is True
    assert got["reached"] is True, got


def test_an_empty_tier_did_not_bite(reference_storage):
    f0 = fault("tier_flush", tiers=["l1", "redis", "fs"])
    f0.apply(FaultContext(stack=reference_storage))  # empty everything first
    f = fault("tier_flush", tiers=["l1", "redis"])
    ctx = FaultContext(stack=reference_storage)
    f.apply(ctx)
    ev = f.evidence(ctx)
    assert ev["bit"] is False
    assert "l1: L1 held nothing at apply" in ev["reason"] and "redis: Redis held no key" in ev["reason"]


def test_a_tier_the_stack_lacks_fails_apply(tmp_path):
    from kvchaos_support import local_stack

    stack = local_stack(tmp_path, "services:\n  idle: {command: [sleep, '1']}\n")
    f = fault("tier_flush", tiers=["l1", "fs"])
    with pytest.raises(RuntimeError, match=r"no l1 \(x-kvchaos.lmcache_http\), fs \(x-kvchaos.l2_fs_path\)"):
        f.apply(FaultContext(stack=stack))
    assert f.evidence(FaultContext(stack=stack))["bit"] is False


def test_tiers_listed_twice_are_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="listed twice"):
        fault("tier_flush", tiers=["l1", "l1"])
