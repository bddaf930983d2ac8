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
    assert ev["corrupted"] == 5 and ev["by_target"] == {"fs": 5, "redis": 0}
    # read only after the heal: nothing was read while the fault was active
    assert ev["bit"] is False and ev["reads_of_corrupted"] == 0 and "none read" in ev["reason"]
    assert sorted(o["name"] for o in ev["objects"]) == cut
    assert ev["lmcache_load_failures"] is None  # no lmcache_http in this stack
    # the same seed picks the same files
    again = fault("l2_corrupt", mode="truncate", target="fs", fraction=0.5)
    for i in range(10):
        (Path(fs_stack.settings.l2_fs_path) / object_name(i)).write_bytes(payload(i))
    again.apply(FaultContext(stack=fs_stack, rng=random.Random(7)))
    assert sorted(o["name"] for o in again.evidence(ctx)["objects"]) == cut


def test_reads_of_corrupted_files_while_active_make_it_bite(fs_stack):
    """Reads are counted per corrupted object, while the fault is active: an uncorrupted file
    read, or a corrupted one read after the heal, does not count."""
    l2 = Path(fs_stack.settings.l2_fs_path)
    f = fault("l2_corrupt", mode="bitflip", bits=8, target="fs", fraction=0.5)
    ctx = FaultContext(stack=fs_stack, rng=random.Random(7))
    f.apply(ctx)
    hit = sorted(o["name"] for o in f._done["fs"])
    spared = sorted(n for i in range(10) if (n := object_name(i)) not in hit)
    time.sleep(0.02)  # a later clock tick than the corruption
    (l2 / spared[0]).read_bytes()
    (l2 / hit[0]).read_bytes()
    (l2 / hit[1]).read_bytes()
    (l2 / hit[1]).read_bytes()
    f.heal(ctx)
    (l2 / hit[2]).read_bytes()  # after the heal: not counted
    ev = f.evidence(ctx)
    assert ev["bit"] is True and ev["reads_of_corrupted"] == 2 and ev["reads"]["fs"] == 2, ev
    assert ev["must_be_read"] is True and "reason" not in ev


def test_delete_must_be_read_unless_told_otherwise(fs_stack):
    """Issue 34: a delete of objects no read ever touched used to bite by default."""
    ctx = FaultContext(stack=fs_stack)
    strict = fault("l2_corrupt", mode="delete", target="fs", key_selector=object_name(2))
    strict.apply(ctx)
    strict.heal(ctx)
    ev = strict.evidence(ctx)
    assert ev["must_be_read"] is True and ev["read"] is False
    assert ev["bit"] is False and "could not be observed" in ev["reason"]  # no reads of a deleted file
    loose = fault("l2_corrupt", mode="delete", target="fs", key_selector=object_name(1), must_be_read=False)
    loose.apply(ctx)
    loose.heal(ctx)
    ev = loose.evidence(ctx)
    assert ev["bit"] is True and ev["read"] is False  # acted; its default trigger (a read) is not reached


def test_fraction_is_the_same_share_on_every_pass(fs_stack):
    """With repeat_every, each pass takes the fraction of the objects new to it: the share
    corrupted stays at `fraction` instead of compounding over the passes."""
    l2 = Path(fs_stack.settings.l2_fs_path)
    f = fault("l2_corrupt", mode="truncate", target="fs", fraction=0.5, must_be_read=False)
    ctx = FaultContext(stack=fs_stack, rng=random.Random(3))
    assert f.apply(ctx)["corrupted"] == 5
    for _ in range(4):  # four more passes over the same ten objects plus two new ones each
        for i in range(2):
            (l2 / object_name(100 + f._passes * 2 + i)).write_bytes(payload(i))
        f._pass(ctx)
    f.heal(ctx)
    assert f._passes == 5 and f._considered == 18
    assert sum(len(v) for v in f._done.values()) == 9  # round(0.5 * 18), not 1 - 0.5**5 of the first ten
    first_ten = {object_name(i) for i in range(10)}
    assert sum(o["name"] in first_ten for o in f._done["fs"]) == 5


def test_bitflip_bits_within_a_byte_range(fs_stack):
    f = fault("l2_corrupt", mode="bitflip", target="fs", bits=64, byte_range=[1024, 2048],
              key_selector=object_name(5), must_be_read=False)
    ctx = FaultContext(stack=fs_stack, rng=random.Random(2))
    f.apply(ctx)
    f.heal(ctx)
    got, want = fs_objects(fs_stack)[object_name(5)], payload(5)
    flipped = [(i, b) for i, (x, y) in enumerate(zip(got, want)) for b in range(8) if (x ^ y) >> b & 1]
    assert len(got) == len(want) and len(flipped) == 64
    assert all(1024 <= i < 2048 for i, _ in flipped)
    (o,) = f.evidence(ctx)["objects"]
    assert o["bits_flipped"] == 64 and o["flips"] == [list(x) for x in flipped[:8]]
    # a range past the end of an object leaves it alone
    past = fault("l2_corrupt", mode="bitflip", target="fs", byte_range=[CHUNK, CHUNK + 10],
                 key_selector=object_name(6), must_be_read=False)
    past.apply(ctx)
    past.heal(ctx)
    assert fs_objects(fs_stack)[object_name(6)] == payload(6) and past.evidence(ctx)["bit"] is False


def test_bits_and_byte_range_are_for_bitflip_only():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="bitflip only"):
        fault("l2_corrupt", mode="truncate", bits=4)
    # a dump of the params (what the journal keeps) loads again
    f = fault("l2_corrupt", mode="truncate")
    assert type(f.params).model_validate(f.params.model_dump(mode="json")) == f.params
    with pytest.raises(ValidationError, match="start < end"):
        fault("l2_corrupt", mode="bitflip", byte_range=[10, 10])


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
    assert diff == [(o["offset"], 1 << o["bit"])] and o["bits_flipped"] == 1


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

        gone = fault("l2_corrupt", mode="delete", target="redis", fraction=0.5, must_be_read=False)
        gone.apply(ctx)
        gone.heal(ctx)
        ev = gone.evidence(ctx)
        assert ev["bit"] is True and ev["by_target"]["redis"] == 3
        assert sum(r.exists(redis_key(i)) for i in range(6)) == 3
        assert r.get("unrelated") == b"keep me"  # not an LMCache key

        # Reads: GETs of corrupted keys by another client while the fault is active count (once
        # per key for reads_of_corrupted, every GET in redis_gets); the fault's own GETs, GETs of
        # spared keys and GETs after the heal do not. SLOWLOG settings come back at heal.
        before = r.config_get("slowlog-*")
        for i in range(6):
            r.set(redis_key(i), payload(i), ex=600)
        flips = fault("l2_corrupt", mode="bitflip", bits=16, target="redis", fraction=0.5)
        flips.apply(ctx)
        assert r.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"] == "0"
        hit = sorted(o["name"] for o in flips._done["redis"])
        spared = sorted(set(redis_key(i) for i in range(6)) - set(hit))
        assert len(hit) == 3
        r.get(hit[0]), r.get(hit[0]), r.get(hit[1]), r.get(spared[0]), r.exists(hit[2])
        flips.heal(ctx)
        r.get(hit[2])
        ev = flips.evidence(ctx)
        assert ev["bit"] is True and ev["reads"]["redis"] == 2 and ev["reads"]["redis_gets"] == 3, ev
        assert ev["reads_of_corrupted"] == 2
        assert r.config_get("slowlog-*") == before
        quiet = fault("l2_corrupt", mode="truncate", target="redis", key_selector=spared[1])
        quiet.apply(ctx)
        quiet.heal(ctx)
        ev = quiet.evidence(ctx)
        assert ev["bit"] is False and ev["reads"]["redis"] == 0 and "none read" in ev["reason"]
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


#: LMCACHE_FS_STACK with Redis (the ``resp`` adapter) as its only L2 instead of the filesystem.
LMCACHE_REDIS_STACK = (
    LMCACHE_FS_STACK
    .replace("""'{"type": "fs", "base_path": "${KVCHAOS_RUN_DIR}/l2fs"}']""",
             """'{"type": "resp", "host": "127.0.0.1", "port": ${REDIS_PORT:-0}, "num_workers": 2}']
    depends_on: {redis: {condition: service_healthy}}""")
    .replace("services:\n", "services:\n" + REDIS_STACK.split("services:\n")[1].split("x-kvchaos:")[0])
    .replace("  l2_fs_path: ${KVCHAOS_RUN_DIR}/l2fs\n",
             '  redis: {service: redis, url: "redis://127.0.0.1:${REDIS_PORT:-0}"}\n')
)


@needs_lmcache
@needs_redis
@pytest.mark.slow
def test_reads_of_truncated_redis_objects_by_lmcache(tmp_path):
    """Issue 12's case: objects truncated in Redis (LMCache's resp adapter logs "GET: size header
    mismatch" when it reads them). Read while the fault is active: the GETs and LMCache's
    load failures are counted and the fault bit. Healed before the reads (the shape of a
    scenario that corrupts in a phase without requests): it did not bite, and says why, where
    the old evidence said "bit" with 0 load failures."""
    import subprocess

    import httpx

    lmcache = str(Path(sys.executable).with_name("lmcache"))
    stack: LocalStack

    def bench(seq: int) -> None:  # one 512-token request: 2 chunks stored, then looked up and retrieved
        subprocess.run([lmcache, "bench", "server", "--rpc-url", f"tcp://127.0.0.1:{stack.env['LMCACHE_PORT']}",
                        "--url", stack.settings.lmcache_http, "--mode", "cpu", "--num-tokens", "512",
                        "--start", str(seq), "--end", str(seq + 1), "--kvcache-shape-spec",
                        "(2,64,16,4,64):float32:4", "-q"], capture_output=True, timeout=120, check=False)

    def clear_l1() -> None:
        httpx.post(f"{stack.settings.lmcache_http}/cache/clear", timeout=10).raise_for_status()

    for case in ("late", "active"):  # a fresh LMCache each (its index of Redis keys starts empty)
        (tmp_path / case).mkdir()
        stack = local_stack(tmp_path / case, LMCACHE_REDIS_STACK)
        with stack:
            ctx = FaultContext(stack=stack)
            bench(0)
            clear_l1()
            flt = fault("l2_corrupt", mode="truncate", target="redis")
            assert flt.apply(ctx)["corrupted"] == 2
            if case == "late":
                flt.heal(ctx)
                failed_before = flt._load_failures()
                bench(0)  # the reads come after the heal
                ev = flt.evidence(ctx)
                assert ev["bit"] is False and ev["reads_of_corrupted"] == 0, ev
                assert ev["lmcache_load_failures"] == 0 and "none read while the fault was active" in ev["reason"]
                assert flt._load_failures() - failed_before == 2  # LMCache did read them: too late to count
            else:
                bench(0)
                flt.heal(ctx)
                ev = flt.evidence(ctx)
                assert ev["bit"] is True and ev["reads"]["redis"] == 2 and ev["lmcache_load_failures"] == 2, ev
        assert open_entries(stack.journal.path) == []
