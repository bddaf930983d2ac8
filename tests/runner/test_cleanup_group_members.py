"""`kvchaos cleanup`'s wait for an ended process group: a member reaped between reading its group
and reading its status is gone, not an error (psutil raises NoSuchProcess for the status)."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from chaos import cleanup


def test_a_member_reaped_between_the_group_read_and_the_status_read_counts_as_gone(monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    proc = psutil.Process(child.pid)
    child.wait()  # reaped: its status can no longer be read
    with pytest.raises(psutil.NoSuchProcess):
        proc.status()
    monkeypatch.setattr(cleanup, "_pgid", lambda pid: 4242)  # the group read came first
    assert cleanup._live_member(proc, 4242) is False


def test_a_live_member_of_the_group_counts_and_one_of_another_group_does_not():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        proc = psutil.Process(child.pid)
        assert cleanup._live_member(proc, child.pid) is True
        assert cleanup._live_member(proc, child.pid + 1) is False
    finally:
        child.kill()
        child.wait()
