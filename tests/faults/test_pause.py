"""pause: real process groups under LocalStack are frozen (SIGSTOP) and thawed (SIGCONT)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import httpx
import psutil
import pytest

from chaos.faults.base import FaultContext
from chaos.journal import open_entries
from kvchaos_support import fault, local_stack, started

STACK = """
services:
  web:
    command: [python, -m, http.server, "${WEB_PORT:-0}", --bind, 127.0.0.1]
    healthcheck:
      test: [CMD, kvchaos, probe, "http://127.0.0.1:${WEB_PORT:-0}/"]
      interval: 100ms
      retries: 100
    stop_grace_period: 2s
  worker:
    # A parent and a child in one process group: both must freeze and thaw.
    command: "sh -c 'sleep 300 & wait'"
    stop_grace_period: 1s
"""


@pytest.fixture
def stack(tmp_path: Path):
    with started(local_stack(tmp_path, STACK)) as st:
        yield st


def group_statuses(pgid: int) -> list[str]:
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.info["status"])
        except (ProcessLookupError, psutil.Error):
            pass
    return out


@pytest.mark.slow
def test_pause_freezes_the_whole_group_and_heal_thaws_it(stack):
    f = fault("pause", service="worker")
    ctx = FaultContext(stack=stack)
    pgid = stack.status()["worker"].detail["pgid"]
    applied = f.apply(ctx)
    assert applied["frozen"] is True and applied["pids"] >= 2
    assert set(group_statuses(pgid)) == {psutil.STATUS_STOPPED}
    assert stack.status()["worker"].state == "paused"
    # journalled, so `kvchaos cleanup` would resume it after a killed run
    assert any(e["kind"] == "paused" for e in open_entries(stack.journal.path))
    time.sleep(0.2)
    healed = f.heal(ctx)
    assert healed["resumed"] is True and healed["still_stopped"] == 0
    assert psutil.STATUS_STOPPED not in group_statuses(pgid)
    assert not any(e["kind"] == "paused" for e in open_entries(stack.journal.path))
    ev = f.evidence(ctx)
    assert ev["bit"] is True and ev["stopped_s"] >= 0.2


@pytest.mark.slow
def test_a_paused_server_accepts_but_never_answers(stack):
    port = int(stack.env["WEB_PORT"])
    f = fault("pause", service="web")
    ctx = FaultContext(stack=stack)
    f.apply(ctx)
    try:
        # The kernel still completes the TCP handshake (listen backlog): a gray failure.
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(f"http://127.0.0.1:{port}/", timeout=httpx.Timeout(0.5, connect=2))
    finally:
        f.heal(ctx)
    assert httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200
    assert f.evidence(ctx)["bit"] is True


@pytest.mark.slow
def test_a_service_resumed_behind_the_faults_back_did_not_bite(stack):
    f = fault("pause", service="worker")
    ctx = FaultContext(stack=stack)
    f.apply(ctx)
    stack.resume("worker")  # someone else thawed it mid-fault: it was not stopped throughout
    f.heal(ctx)
    ev = f.evidence(ctx)
    assert ev["bit"] is False and ev["at_heal"]["frozen"] is False


def test_heal_without_apply_does_nothing():
    f = fault("pause", service="web")
    assert f.heal(FaultContext(stack=None))["resumed"] is False
    assert f.evidence(FaultContext())["bit"] is False
