"""The filesystem L2's tmpfs is unmounted by ``down()`` whatever is mounted there, and a mount
``down()`` cannot undo is reported and left in the journal for ``kvchaos cleanup``, never dropped
in silence.

Input: CI found the l2fs tmpfs of tests/compose/test_compose_run.py's SIGINT run still mounted
hours later (pytest could not remove its basetemp: EBUSY), with the run's journal closed. The
teardown unmounted once, ignored umount's answer and closed the journal entry whatever happened
(chaos/stack/local.py ``_unmount_l2``, shared by ComposeStack).
"""

from __future__ import annotations

import subprocess

import pytest

from chaos.cleanup import cleanup
from chaos.journal import Journal, open_entries
from chaos.stack.base import StackError
from kvchaos_support import local_stack, mounts_under, needs_root

pytestmark = [needs_root, pytest.mark.slow]

STACK = """
services:
  idle:
    command: [sleep, "300"]
    stop_signal: SIGKILL
x-kvchaos:
  l2_fs_path: ${KVCHAOS_RUN_DIR}/l2/fs
  l2_fs_size: 2m
"""


@pytest.fixture
def undo(tmp_path):
    """Whatever a failing test left mounted under tmp_path is detached afterwards."""
    yield
    for point in reversed(mounts_under(tmp_path)):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _stack(tmp_path):
    journal = Journal("l2-unmount", directory=tmp_path / "state" / "journal")
    return local_stack(tmp_path, STACK, journal=journal), journal


def test_down_unmounts_every_tmpfs_stacked_on_the_l2_path(tmp_path, undo):
    """A second tmpfs mounted over the L2 (another program, a run before this one): one umount
    took the top one only, and the journal entry was closed with the L2's own tmpfs still there."""
    stack, journal = _stack(tmp_path)
    stack.up()
    l2 = stack.settings.l2_fs_path
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "kvchaos-test-over", l2], check=True)
    assert len(mounts_under(tmp_path)) == 2
    stack.down()
    assert mounts_under(tmp_path) == []
    assert open_entries(journal.path) == []


def test_a_mount_down_cannot_undo_is_reported_and_kept_for_cleanup(tmp_path, undo):
    """The L2's folder hidden under a tmpfs mounted on its parent: umount cannot reach it. down()
    raises a StackError naming it and keeps the journal entry; once the parent's mount is gone,
    ``kvchaos cleanup`` unmounts the L2 from the journal."""
    stack, journal = _stack(tmp_path)
    stack.up()
    l2 = stack.settings.l2_fs_path
    parent = str(tmp_path / "run" / "l2")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "kvchaos-test-over", parent], check=True)
    with pytest.raises(StackError, match="could not unmount the filesystem L2") as err:
        stack.down()
    assert l2 in str(err.value) and "kvchaos cleanup" in str(err.value)
    assert [e["kind"] for e in open_entries(journal.path)] == ["mount"]
    assert not stack.state_path.exists()  # the rest of down() was done
    subprocess.run(["umount", parent], check=True)
    report = cleanup(journal.directory, force=[journal.run_id])
    assert report.errors == [] and report.undone == [f"unmounted {l2}"], report
    assert mounts_under(tmp_path) == []
