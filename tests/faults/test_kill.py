"""kill: real processes under LocalStack are signalled, seen exiting, and started again."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest

from chaos.faults.base import FaultContext
from chaos.journal import open_entries
from chaos.stack.local import LocalStack
from kvchaos_support import fault, flaky_stack, local_stack, started

STACK = """
x-kvchaos:
  engine: web
services:
  web:
    command: [python, -m, http.server, "${WEB_PORT:-0}", --bind, 127.0.0.1]
    healthcheck:
      test: [CMD, kvchaos, probe, "http://127.0.0.1:${WEB_PORT:-0}/"]
      interval: 100ms
      retries: 100
    stop_grace_period: 2s
  stubborn:
    # Ignores SIGTERM, as a server wedged in shutdown does.
    command: [python, -c, "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"]
    stop_grace_period: 1s
"""


@pytest.fixture
def stack(tmp_path: Path):
    with started(local_stack(tmp_path, STACK)) as st:
        yield st


def web_answers(stack: LocalStack) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{stack.env['WEB_PORT']}/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_sigkill_then_heal_starts_it_again(stack):
    f = fault("kill", service="web")
    ctx = FaultContext(stack=stack)
    old_pid = stack.status()["web"].pid
    applied = f.apply(ctx)
    assert applied["exited"] is True and applied["returncode"] == -9
    assert stack.status()["web"].state == "exited"
    assert not web_answers(stack)
    healed = f.heal(ctx)
    assert healed["restarted"] and healed["restarted_by"] == "heal"
    assert stack.status()["web"].state == "running" and healed["pid"] != old_pid
    assert web_answers(stack)
    ev = f.evidence(ctx)
    assert ev["bit"] is True and ev["exit_recorded_as_expected"] is True
    assert stack.unexpected_exits() == []
    # only the new web process is still journalled (plus the untouched stubborn one)
    keys = {e["key"] for e in open_entries(stack.journal.path)}
    assert f"web:{old_pid}" not in keys and f"web:{healed['pid']}" in keys


@pytest.mark.slow
def test_restart_after_brings_it_back_before_heal(stack):
    f = fault("kill", service="web", restart_after="300ms")
    ctx = FaultContext(stack=stack)
    f.apply(ctx)
    deadline = time.monotonic() + 15
    while not web_answers(stack) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert web_answers(stack), "the timer did not restart the service"
    healed = f.heal(ctx)
    assert healed["restarted_by"] == "timer" and healed["timer_error"] is None
    assert healed["down_s"] >= 0.3
    assert f.evidence(ctx)["bit"] is True


@pytest.mark.slow
def test_a_timer_restart_that_failed_makes_heal_raise_after_restarting(stack):
    """Another process took the port while the service was down: the timer's restart fails. Heal
    starts it again once the port is free, and still raises: the stack ran without the service
    (and with a failed process) between the two, which no scenario describes."""
    f = fault("kill", service="web", restart_after="500ms")
    ctx = FaultContext(stack=stack)
    f.apply(ctx)
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the probes' connections in TIME_WAIT
    try:
        squatter.bind(("127.0.0.1", int(stack.env["WEB_PORT"])))
        squatter.listen()
        deadline = time.monotonic() + 30
        while f._restarted_at is None and time.monotonic() < deadline:  # the timer has run
            time.sleep(0.05)
    finally:
        squatter.close()
    with pytest.raises(RuntimeError, match=r"restart of service 'web' 0.5s after the kill failed \(StackError: "
                                           r"service 'web' exited"):
        f.heal(ctx)
    assert web_answers(stack) and stack.status()["web"].state == "running"
    assert f.evidence(ctx)["bit"] is True


@pytest.mark.slow
def test_sigterm_that_is_ignored_did_not_bite(stack):
    f = fault("kill", service="stubborn", signal="SIGTERM")
    ctx = FaultContext(stack=stack)
    applied = f.apply(ctx)
    assert applied["exited"] is False
    assert stack.status()["stubborn"].state == "running"
    assert f.heal(ctx)["restarted"] is False  # it never stopped, nothing to start
    ev = f.evidence(ctx)
    assert ev["bit"] is False and "SIGTERM" in ev["reason"]


@pytest.mark.slow
def test_sigterm_stops_a_service_that_honours_it(stack):
    f = fault("kill", service="web", signal="SIGTERM")
    ctx = FaultContext(stack=stack)
    assert f.apply(ctx)["exited"] is True
    f.heal(ctx)
    assert f.evidence(ctx)["bit"] is True and web_answers(stack)


def test_heal_without_a_stack_is_harmless():
    # `kvchaos cleanup` heals faults with no stack; the processes are ended from the journal.
    f = fault("kill", service="web")
    assert f.heal(FaultContext(stack=None))["restarted"] is False
    assert f.evidence(FaultContext(stack=None))["bit"] is False


def test_service_must_exist_in_the_stack(tmp_path):
    from chaos.scenario.loader import validate_against_stack
    from chaos.scenario.model import Scenario
    from chaos.yamlsource import ConfigError

    s = Scenario.model_validate(
        {"name": "t", "stack": "s.yml", "checks": {"evidence": {}},
         "phases": [{"name": "p", "faults": [{"kind": "kill", "service": "lmcach", "duration": 1}]}]},
        context={"check_paths": False})
    with pytest.raises(ConfigError, match="unknown service 'lmcach'"):
        validate_against_stack(s, [], ["lmcache", "engine"])
    validate_against_stack(s.model_copy(), [], None)  # no service list: not checked


def test_signal_is_sigkill_or_sigterm():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        fault("kill", service="web", signal="SIGHUP")
    assert fault("kill", service="web").params.signal == "SIGKILL"


def _crash_at_timed_restart(tmp_path: Path, judges: bool, crashing: str = "2"):
    with started(local_stack(tmp_path, flaky_stack(crashing))) as st:
        f = fault("kill", service="flaky", restart_after="300ms")
        ctx = FaultContext(stack=st, judges_service_exits=judges)
        f.apply(ctx)
        deadline = time.monotonic() + 30
        while f._restarted_at is None and time.monotonic() < deadline:  # the timer has run
            time.sleep(0.05)
        assert f._restarted_at is not None, "the timer never ran"
        return f.heal(ctx), st.unexpected_exits(), st.status()["flaky"].state, f.evidence(ctx)


@pytest.mark.slow
def test_a_timed_restart_that_crashes_is_the_services_exit_not_an_infrastructure_error(tmp_path):
    healed, unexpected, state, ev = _crash_at_timed_restart(tmp_path, judges=True)
    assert "exited (code 3) before it became healthy" in healed["crashed_at_restart"]
    assert "lost bind" not in healed["crashed_at_restart"]
    assert healed["timer_error"] is None and healed["restarted_by"] == "heal"
    assert [(e.service, e.returncode, e.expected) for e in unexpected] == [("flaky", 3, False)]
    assert state == "running" and ev["bit"] is True


@pytest.mark.slow
def test_a_timed_restart_that_crashes_is_unknown_when_no_check_judges_exits(tmp_path):
    with pytest.raises(RuntimeError, match=r"(?s)restart of service 'flaky' 0.3s after the kill failed .*exited "
                                           r"\(code 3\).*add liveness"):
        _crash_at_timed_restart(tmp_path, judges=False)


@pytest.mark.slow
def test_heal_starts_again_a_service_whose_start_ups_crash(tmp_path):
    """The timer's restart and heal's first start crash; heal's second start serves."""
    healed, unexpected, state, _ = _crash_at_timed_restart(tmp_path, judges=True, crashing="2,3")
    assert healed["crashed_at_restart"].count("exited (code 3)") == 2
    assert healed["crashed_at_restart"].startswith("timer: ") and "; heal: " in healed["crashed_at_restart"]
    assert [(e.returncode, e.expected) for e in unexpected] == [(3, False), (3, False)]
    assert state == "running"


@pytest.mark.slow
def test_heal_gives_up_when_every_start_up_crashes(tmp_path):
    with pytest.raises(Exception, match=r"exited \(code 3\) before it became healthy"):
        _crash_at_timed_restart(tmp_path, judges=True, crashing="2,3,4,5,6")
