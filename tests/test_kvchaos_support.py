"""tests/kvchaos_support.py's process helpers on the states a scan of a starting stack meets."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from kvchaos_support import command_line


def test_a_zombie_child_reads_as_an_empty_command_line_not_an_error():
    """The input: CI's tests/vllm/test_benchmark_signals.py raised ``psutil.ZombieProcess`` from
    ``p.cmdline()`` for a child of the benchmark that had exited and was not reaped yet."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        proc = psutil.Process(child.pid)
        deadline = time.monotonic() + 30
        while proc.status() != psutil.STATUS_ZOMBIE:  # exited, not reaped: we have not waited
            assert time.monotonic() < deadline, proc.status()
            time.sleep(0.05)
        assert proc.is_running()  # what the old scan checked before reading the command line
        with pytest.raises(psutil.ZombieProcess):
            proc.cmdline()
        assert command_line(proc) == ""
        assert command_line(child.pid) == ""
    finally:
        child.wait()
    assert command_line(child.pid) == ""  # reaped: no such process


def test_a_live_process_reads_as_its_command_line():
    code = "import time; print('up', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "up\n"  # past exec: /proc shows the new command line
        assert command_line(child.pid) == f"{sys.executable} -c {code}"
    finally:
        child.kill()
        child.wait()
