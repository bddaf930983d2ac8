"""disk_full: the size-capped tmpfs of a LocalStack is filled to ENOSPC and emptied again; with a
real LMCache server on it, LMCache's own counters show the failed L2 stores."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.faults.base import FaultContext
from chaos.journal import open_entries
from chaos.stack.local import LocalStack
from kvchaos_support import LMCACHE_FS_STACK, fault, local_stack, needs_lmcache, needs_root

SMALL = """
services:
  idle:
    command: [sleep, "300"]
    stop_signal: SIGKILL
x-kvchaos:
  l2_fs_path: ${KVCHAOS_RUN_DIR}/l2fs
  l2_fs_size: 2m
"""

UNCAPPED = SMALL.replace("  l2_fs_size: 2m\n", "")

LMCACHE = LMCACHE_FS_STACK + "  l2_fs_size: 16m\n"


@needs_root
@pytest.mark.slow
def test_fills_the_mount_to_enospc_and_heal_empties_it(tmp_path):
    stack = local_stack(tmp_path, SMALL)
    with stack:
        l2 = Path(stack.settings.l2_fs_path)
        assert os.path.ismount(l2)
        f = fault("disk_full")
        ctx = FaultContext(stack=stack)
        applied = f.apply(ctx)
        ballast = Path(applied["ballast"])
        assert ballast.parent == l2 and ballast.stat().st_size >= 1 << 20
        assert applied["free_bytes"] < 4096
        # the ballast is journalled before it is written
        assert {"file"} <= {e["kind"] for e in open_entries(stack.journal.path)}
        with pytest.raises(OSError) as err:
            (l2 / "x.data").write_bytes(b"\0" * 8192)
        assert err.value.errno == errno.ENOSPC
        (l2 / "x.data").unlink(missing_ok=True)
        healed = f.heal(ctx)
        assert healed["removed"] is True and not ballast.exists()
        assert not any(e["kind"] == "file" for e in open_entries(stack.journal.path))
        ev = f.evidence(ctx)
        # no LMCache in this stack: the filesystem fallback, and it says so
        assert ev["bit"] is True and ev["source"].startswith("filesystem (the stack has no x-kvchaos.lmcache_http")
        (l2 / "y.data").write_bytes(b"\0" * 8192)  # room again
    assert open_entries(stack.journal.path) == []
    assert not os.path.ismount(l2)


@pytest.mark.slow
def test_refuses_a_folder_that_is_not_a_capped_mount(tmp_path):
    stack = local_stack(tmp_path, UNCAPPED)
    with stack:
        Path(stack.settings.l2_fs_path).mkdir(parents=True)  # as LMCache's fs adapter makes it
        f = fault("disk_full")
        ctx = FaultContext(stack=stack)
        with pytest.raises(RuntimeError, match="not a size-capped mount: set x-kvchaos.l2_fs_size"):
            f.apply(ctx)
        assert f.heal(ctx)["removed"] is False
        assert list(Path(stack.settings.l2_fs_path).iterdir()) == []
    assert open_entries(stack.journal.path) == []


def test_needs_a_filesystem_l2(tmp_path):
    stack = local_stack(tmp_path, "services:\n  idle: {command: [sleep, '1']}\n")
    with pytest.raises(RuntimeError, match="x-kvchaos.l2_fs_path"):
        fault("disk_full").apply(FaultContext(stack=stack))


def _bench(stack: LocalStack, start: int, end: int) -> subprocess.CompletedProcess:
    lmcache = Path(sys.executable).with_name("lmcache")
    return subprocess.run(
        [str(lmcache), "bench", "server", "--rpc-url", f"tcp://127.0.0.1:{stack.env['LMCACHE_PORT']}",
         "--url", stack.settings.lmcache_http, "--mode", "cpu", "--num-tokens", "512",
         "--start", str(start), "--end", str(end), "--kvcache-shape-spec", "(2,64,16,4,64):float32:4"],
        capture_output=True, text=True, timeout=120)


@needs_root
@needs_lmcache
@pytest.mark.slow
def test_lmcache_counts_the_l2_stores_that_failed(tmp_path):
    stack = local_stack(tmp_path, LMCACHE)
    with stack:
        f = fault("disk_full")
        ctx = FaultContext(stack=stack)
        f.apply(ctx)
        r = _bench(stack, 0, 2)  # stores 2 requests x 2 chunks of 2 MiB through LMCache's CPU path
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        f.heal(ctx)
        ev = f.evidence(ctx)
        assert ev["source"] == "lmcache /metrics", ev
        assert ev["bit"] is True and ev["failed_store_chunks"] > 0 and ev["stored_chunks"] == 0, ev
        data = [p for p in Path(stack.settings.l2_fs_path).iterdir()]
        assert data == []  # nothing stored, no ballast, no temp file left behind
        # with the ballast gone, stores succeed again
        assert _bench(stack, 10, 11).returncode == 0
        assert any(p.suffix == ".data" for p in Path(stack.settings.l2_fs_path).iterdir())
    assert open_entries(stack.journal.path) == []


@needs_root
@pytest.mark.slow
def test_cleanup_after_a_killed_run_deletes_the_ballast(tmp_path):
    """The runner died between apply and heal: `kvchaos cleanup` works from the journal alone
    (it heals each journalled fault with no stack, then removes the ballast file)."""
    from chaos.cleanup import cleanup
    from chaos.journal import Journal

    journal = Journal("killed-run", directory=tmp_path / "journal")
    stack = local_stack(tmp_path, SMALL, journal=journal)
    stack.up()
    try:
        flt = fault("disk_full")
        # what the runner's Nemesis journals before apply
        journal.add("fault", flt.id, fault_kind="disk_full", params=flt.params.model_dump(mode="json"),
                    proxy_api=None)
        ballast = Path(flt.apply(FaultContext(stack=stack))["ballast"])
        # every kind of this module family must heal from the journal without a stack, too
        for kind, fields in [("kill", {"service": "idle"}), ("pause", {"service": "idle"}),
                             ("l2_corrupt", {"mode": "delete"}), ("cancel", {}), ("preempt", {}),
                             ("hook", {"service": "idle", "apply": {"argv": ["true"]}})]:
            other = fault(kind, name=f"{kind}-x", **fields)
            journal.add("fault", other.id, fault_kind=kind, params=other.params.model_dump(mode="json"),
                        proxy_api=None)
        # This test process is the journal's (live) owner: force it, as `--force killed-run`.
        report = cleanup(tmp_path / "journal", force=["killed-run"])
        assert report.errors == []
        # cleanup unmounts the tmpfs (and the ballast goes with it), then undoes the file entry
        assert not ballast.exists()
        assert not os.path.ismount(stack.settings.l2_fs_path)
        # The input that showed it: the heal from the journal has no ballast of its own (the
        # file entry removes it), and cleanup used to print "healed fault ... (disk_full)".
        assert "fault disk_full-0 (disk_full): nothing to heal (no ballast was written); what it " \
            "left is undone by the entries below" in report.undone
        assert not any(m.startswith("healed fault disk_full-0") for m in report.undone)
    finally:
        stack.down()
    assert list((tmp_path / "journal").iterdir()) == []
