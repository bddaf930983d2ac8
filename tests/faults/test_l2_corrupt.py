"""l2_corrupt: LMCache-named objects in a filesystem L2 folder and in a real Redis are truncated,
deleted or bit-flipped; other files and keys are left alone."""

from __future__ import annotations

import hashlib
import random
import sys
import time
from pathlib import Path

import pytest

from chaos.faults.base import FaultContext
from chaos.journal import open_entries
from chaos.stack.local import LocalStack
from kvchaos_support import LMCACHE_FS_STACK, fault, local_stack, needs_lmcache, needs_redis

FS_STACK = """
services:
  idle: {command: [sleep, "300"]}
x-kvchaos:
  l2_fs_path: ${KVCHAOS_RUN_DIR}/l2fs
"""

REDIS_STACK = """
services:
  redis:
    command: [redis-server, --port, "${REDIS_PORT:-0}", --bind, 127.0.0.1, --save, "", --appendonly, "no"]
    healthcheck:
      test: [CMD, kvchaos, probe, "tcp://127.0.0.1:${REDIS_PORT:-0}"]
      interval: 100ms
      retries: 100
    stop_grace_period: 2s
x-kvchaos:
  redis: {service: redis, url: "redis://127.0.0.1:${REDIS_PORT:-0}"}
"""

CHUNK = 4096  # bytes per stored object in these tests


def object_name(i: int, salt: str = "") -> str:
    """LMCache 0.5.6's fs file name for chunk i (fs_l2_adapter._object_key_to_filename)."""
    h = hashlib.sha256(str(i).encode()).hexdigest()
    base = f"kvchaos-ref@0x01000100@0@{h}"
    return f"{base}@{salt}.data" if salt else f"{base}.data"


def redis_key(i: int) -> str:
    """LMCache 0.5.6's RESP key for chunk i (native_connector_l2_adapter._object_key_to_string)."""
    return f"kvchaos-ref@01000100@0@{hashlib.sha256(str(i).encode()).hexdigest()}"


def payload(i: int) -> bytes:
    return random.Random(i).randbytes(CHUNK)


@pytest.fixture
def fs_stack(tmp_path: Path) -> LocalStack:
    st = local_stack(tmp_path, FS_STACK)  # settings only, not started
    l2 = Path(st.settings.l2_fs_path)
    l2.mkdir(parents=True)
    for i in range(10):
        (l2 / object_name(i)).write_bytes(payload(i))
    (l2 / "notes.txt").write_bytes(b"not an LMCache object")
    (l2 / (object_name(99)[:-5] + ".tmp")).write_bytes(b"\0" * 16)  # a store in progress
    return st


def fs_objects(st: LocalStack) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in Path(st.settings.l2_fs_path).iterdir()}


def test_truncate_a_seeded_fraction_of_the_files(fs_stack):
    f = fault("l2_corrupt", mode="truncate", target="fs", fraction=0.5)
    ctx = FaultContext(stack=fs_stack, rng=random.Random(7))
    assert f.apply(ctx)["corrupted"] == 5
    f.heal(ctx)
    after = fs_objects(fs_stack)
    cut = sorted(n for i in range(10) if len(after[n := object_name(i)]) == CHUNK // 2)
    whole = [n for i in range(10) if after[n := object_name(i)] == payload(i)]
    assert len(cut) == 5 and len(whole) == 5
    assert all(after[object_name(i)] == payload(i)[: CHUNK // 2] for i in range(10) if object_name(i) in cut)
    assert after["notes.txt"] == b"not an LMCache object" and len(after[object_name(99)[:-5] + ".tmp"]) == 16
    ev = f.evidence(ctx)
    assert ev["bit"] is True and ev["corrupted"] == 5 and ev["by_target"] == {"fs": 5, "redis": 0}
    assert sorted(o["name"] for o in ev["objects"]) == cut
    assert ev["lmcache_load_failures"] is None  # no lmcache_http in this stack
    # the same seed picks the same files
    again = fault("l2_corrupt", mode="truncate", target="fs", fraction=0.5)
    for i in range(10):
        (Path(fs_stack.settings.l2_fs_path) / object_name(i)).write_bytes(payload(i))
    again.apply(FaultContext(stack=fs_stack, rng=random.Random(7)))
    assert sorted(o["name"] for o in again.evidence(ctx)["objects"]) == cut


def test_delete_by_key_selector(fs_stack):
    salted = object_name(3, salt="tenant-1")
    (Path(fs_stack.settings.l2_fs_path) / salted).write_bytes(payload(3))
    f = fault("l2_corrupt", mode="delete", target="both", key_selector="*@tenant-1.data")
    ctx = FaultContext(stack=fs_stack)
    assert f.apply(ctx) == {"mode": "delete", "corrupted": 1, "targets": ["fs"]}
    f.heal(ctx)
    assert salted not in fs_objects(fs_stack) and len(fs_objects(fs_stack)) == 12


def test_bitflip_changes_exactly_one_bit(fs_stack):
    f = fault("l2_corrupt", mode="bitflip", target="fs", key_selector=object_name(4))
    ctx = FaultContext(stack=fs_stack, rng=random.Random(1))
    f.apply(ctx)
    f.heal(ctx)
    got, want = fs_objects(fs_stack)[object_name(4)], payload(4)
    assert len(got) == len(want)
    diff = [(i, a ^ b) for i, (a, b) in enumerate(zip(got, want)) if a != b]
    (o,) = f.evidence(ctx)["objects"]
    assert diff == [(o["offset"], 1 << o["bit"])]


def test_repeat_every_hits_objects_stored_during_the_fault(fs_stack):
    f = fault("l2_corrupt", mode="truncate", target="fs", repeat_every="100ms")
    ctx = FaultContext(stack=fs_stack)
    assert f.apply(ctx)["corrupted"] == 10
    late = Path(fs_stack.settings.l2_fs_path) / object_name(50)
    late.write_bytes(payload(50))
    deadline = time.monotonic() + 5
    while late.stat().st_size == CHUNK and time.monotonic() < deadline:
        time.sleep(0.05)
    healed = f.heal(ctx)
    assert late.stat().st_size == CHUNK // 2
    assert healed["passes"] >= 2 and healed["corrupted"]["fs"] == 11
    # once healed, nothing more is touched, and nothing is corrupted twice
    later = Path(fs_stack.settings.l2_fs_path) / object_name(51)
    later.write_bytes(payload(51))
    time.sleep(0.3)
    assert later.read_bytes() == payload(51)
    assert all(len(x) == CHUNK // 2 for n, x in fs_objects(fs_stack).items()
               if n.endswith(".data") and n not in (later.name,))


def test_nothing_stored_means_it_did_not_bite(tmp_path):
    st = local_stack(tmp_path, FS_STACK)
    flt = fault("l2_corrupt", mode="delete", target="fs")
    ctx = FaultContext(stack=st)
    assert flt.apply(ctx)["corrupted"] == 0
    flt.heal(ctx)
    ev = flt.evidence(ctx)
    assert ev["bit"] is False and "no stored object" in ev["reason"]


def test_target_must_exist_in_the_stack(fs_stack):
    with pytest.raises(RuntimeError, match="x-kvchaos.redis"):
        fault("l2_corrupt", mode="delete", target="redis").apply(FaultContext(stack=fs_stack))


def test_fraction_zero_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="fraction 0"):
        fault("l2_corrupt", mode="delete", fraction=0)


@needs_redis
@pytest.mark.slow
def test_redis_values_truncated_flipped_deleted(tmp_path):
    import redis

    st = local_stack(tmp_path, REDIS_STACK)
    with st:
        r = redis.Redis.from_url(st.settings.redis.url)
        for i in range(6):
            r.set(redis_key(i), payload(i), ex=600)
        r.set("unrelated", b"keep me")
        ctx = FaultContext(stack=st, rng=random.Random(3))

        trunc = fault("l2_corrupt", mode="truncate", target="redis", key_selector=redis_key(0))
        assert trunc.apply(ctx)["targets"] == ["redis"]
        trunc.heal(ctx)
        assert r.get(redis_key(0)) == payload(0)[: CHUNK // 2]
        assert r.ttl(redis_key(0)) > 500  # TTL kept, as LMCache set it

        flip = fault("l2_corrupt", mode="bitflip", target="both", key_selector=redis_key(1))
        flip.apply(ctx)
        flip.heal(ctx)
        got = r.get(redis_key(1))
        assert len(got) == CHUNK and sum(bin(a ^ b).count("1") for a, b in zip(got, payload(1))) == 1

        gone = fault("l2_corrupt", mode="delete", target="redis", fraction=0.5)
        gone.apply(ctx)
        gone.heal(ctx)
        ev = gone.evidence(ctx)
        assert ev["bit"] is True and ev["by_target"]["redis"] == 3
        assert sum(r.exists(redis_key(i)) for i in range(6)) == 3
        assert r.get("unrelated") == b"keep me"  # not an LMCache key
        r.close()
    assert open_entries(st.journal.path) == []


@needs_lmcache
@pytest.mark.slow
def test_lmcache_counts_loads_of_truncated_objects_as_failures(tmp_path):
    import subprocess

    import httpx

    stack = local_stack(tmp_path, LMCACHE_FS_STACK)
    lmcache = str(Path(sys.executable).with_name("lmcache"))

    def bench() -> None:  # one 512-token request: lookup, store (2 chunks to L1 and L2), retrieve
        subprocess.run([lmcache, "bench", "server", "--rpc-url", f"tcp://127.0.0.1:{stack.env['LMCACHE_PORT']}",
                        "--url", stack.settings.lmcache_http, "--mode", "cpu", "--num-tokens", "512",
                        "--start", "0", "--end", "1", "--kvcache-shape-spec", "(2,64,16,4,64):float32:4", "-q"],
                       capture_output=True, timeout=120, check=False)

    with stack:
        l2 = Path(stack.settings.l2_fs_path)
        bench()
        assert len(list(l2.glob("*.data"))) == 2
        # L1 emptied: the next lookup of the same prompt is served from L2
        httpx.post(f"{stack.settings.lmcache_http}/cache/clear", timeout=10).raise_for_status()
        flt = fault("l2_corrupt", mode="truncate", target="fs")
        ctx = FaultContext(stack=stack)
        assert flt.apply(ctx)["corrupted"] == 2
        bench()
        flt.heal(ctx)
        ev = flt.evidence(ctx)
        assert ev["bit"] is True and ev["lmcache_load_failures"] == 2, ev
    assert open_entries(stack.journal.path) == []
