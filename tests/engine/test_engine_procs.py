"""The engine tests' process helpers (tests/engine/engine_procs.py) leave nothing running when
a start fails.

Input (2026-12-07, load 22-33 on the two cores): LMCache's /status was not ready within 60 s,
`LMCacheStack.start()` raised inside a session fixture before its `yield`, so the teardown that
stops the stack never ran: six redis-server + `lmcache server` pairs were left running with
parent 1, adding to the load that made the next starts time out too.
"""

from __future__ import annotations

import sys

import pytest

import engine_procs
from engine_procs import Engine, LMCacheStack

NEVER_READY = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_an_lmcache_stack_that_never_gets_ready_is_stopped_before_start_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_procs, "LMCACHE_READY_S", 1.5)
    stack = LMCacheStack(tmp_path)
    stack.server.argv = NEVER_READY  # alive, never answers /status
    with pytest.raises(RuntimeError, match="not ready after 1.5s"):
        stack.start()
    assert stack.redis.popen is not None and stack.redis.popen.poll() is not None, "redis-server left running"
    assert stack.server.popen is not None and stack.server.popen.poll() is not None, "the server left running"


def test_an_engine_that_never_gets_healthy_is_stopped_before_start_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_procs, "ENGINE_READY_S", 1.5)
    eng = Engine("never", tmp_path, [])
    eng.proc.argv = NEVER_READY
    with pytest.raises(RuntimeError, match="not ready after 1.5s"):
        eng.start()
    assert eng.proc.popen is not None and eng.proc.popen.poll() is not None, "the engine left running"
