"""hook: HTTP calls and commands at apply/heal against a small real HTTP server, with the stack's
variables expanded, and evidence from a JSON counter or a command's exit status."""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler

import pytest
from pydantic import ValidationError

from chaos.faults.base import FaultContext
from kvchaos_support import fault as hook_fault, http_server, local_stack


class FaultSwitch(BaseHTTPRequestHandler):
    """POST /fault/on {"drop": n} turns a fault on, POST /fault/off off; GET /status reports
    {"adapters": [{"dropped": count}]}, where count grows by n per request while on."""

    protocol_version = "HTTP/1.1"
    state = {"on": False, "dropped": 0, "calls": []}

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else None
        s = type(self).state
        s["calls"].append((self.path, body))
        if self.path == "/fault/on":
            s["on"] = True
            s["dropped"] += int((body or {}).get("drop", 1))
            return self._send(201, {"on": True})
        if self.path == "/fault/off":
            s["on"] = False
            return self._send(200, {"on": False})
        self._send(404, {"error": "no such route"})

    def do_GET(self) -> None:  # noqa: N802
        self._send(200, {"adapters": [{"dropped": type(self).state["dropped"]}]})


@pytest.fixture
def port():
    FaultSwitch.state = {"on": False, "dropped": 0, "calls": []}
    with http_server(FaultSwitch) as p:
        yield p


STACK = """
services:
  lmcache: {command: [sleep, "1"]}
x-kvchaos:
  lmcache: lmcache
  lmcache_http: http://127.0.0.1:${LMCACHE_HTTP_PORT:-0}
"""


@pytest.fixture
def ctx(port, tmp_path):
    stack = local_stack(tmp_path, STACK, LMCACHE_HTTP_PORT=str(port), MARK_DIR=str(tmp_path))
    return FaultContext(stack=stack, scenario_dir=tmp_path)


def fault(**fields):
    return hook_fault("hook", service="lmcache", **fields)


BASE = "http://127.0.0.1:${LMCACHE_HTTP_PORT}"


def test_http_apply_heal_and_a_counter_as_evidence(ctx, port):
    f = fault(apply={"http": {"url": f"{BASE}/fault/on", "json": {"drop": 3}, "expect_status": 201}},
              heal={"http": {"url": f"{BASE}/fault/off"}},
              evidence={"http": {"url": f"{BASE}/status", "json_path": "adapters.0.dropped", "min_delta": 3}})
    applied = f.apply(ctx)
    assert applied["http"]["url"] == f"http://127.0.0.1:{port}/fault/on" and applied["http"]["status"] == 201
    assert FaultSwitch.state["on"] is True
    healed = f.heal(ctx)
    assert healed["http"]["status"] == 200 and FaultSwitch.state["on"] is False
    assert [c[0] for c in FaultSwitch.state["calls"]] == ["/fault/on", "/fault/off"]
    assert FaultSwitch.state["calls"][0][1] == {"drop": 3}
    ev = f.evidence(ctx)
    assert ev == {"bit": True, "before": 0.0, "after": 3.0, "delta": 3.0, "min_delta": 3.0}


def test_counter_that_grew_too_little_did_not_bite(ctx):
    f = fault(apply={"http": {"url": f"{BASE}/fault/on", "json": {"drop": 1}, "expect_status": [200, 201]}},
              evidence={"http": {"url": f"{BASE}/status", "json_path": "adapters.0.dropped", "min_delta": 2}})
    f.apply(ctx)
    assert f.heal(ctx)["heal"] is None
    assert f.evidence(ctx)["bit"] is False


def test_unexpected_status_fails_apply(ctx):
    f = fault(apply={"http": {"url": f"{BASE}/nope"}},
              evidence={"http": {"url": f"{BASE}/status", "json_path": "adapters.0.dropped"}})
    with pytest.raises(RuntimeError, match="answered HTTP 404"):
        f.apply(ctx)
    f.heal(ctx)
    assert f.evidence(ctx) == {"bit": False, "reason": "the apply step did not succeed"}


def test_argv_steps_and_argv_evidence_with_stack_variables(ctx, tmp_path):
    mark = "${MARK_DIR}/fault-on"
    f = fault(apply={"argv": [sys.executable, "-c", f"open('{mark}', 'w').write('x')"]},
              heal={"argv": [sys.executable, "-c", f"import os; os.remove('{mark}')"]},
              evidence={"argv": [sys.executable, "-c", f"import os, sys; sys.exit(0 if os.path.exists('{mark}') else 1)"]})
    applied = f.apply(ctx)
    assert applied["argv"][2] == f"open('{tmp_path}/fault-on', 'w').write('x')"
    assert (tmp_path / "fault-on").exists()
    f.heal(ctx)
    assert not (tmp_path / "fault-on").exists()
    assert f.evidence(ctx)["bit"] is True  # measured before the heal step removed the mark


def test_failing_command_fails_apply(ctx):
    f = fault(apply={"argv": [sys.executable, "-c", "import sys; sys.stderr.write('no adapter'); sys.exit(3)"]})
    with pytest.raises(RuntimeError, match="exited 3: no adapter"):
        f.apply(ctx)


def test_command_timeout(ctx):
    import subprocess

    f = fault(apply={"argv": [sys.executable, "-c", "import time; time.sleep(5)"], "timeout_s": 0.3})
    with pytest.raises(subprocess.TimeoutExpired):
        f.apply(ctx)


def test_no_evidence_spec_is_inconclusive(ctx):
    f = fault(apply={"http": {"method": "POST", "url": f"{BASE}/fault/on"}})
    f.apply(ctx)
    f.heal(ctx)
    assert f.evidence(ctx) == {"bit": False, "reason": "no evidence spec", "applied": True}


def test_exactly_one_of_http_or_argv():
    with pytest.raises(ValidationError, match="exactly one of `http` or `argv`"):
        fault(apply={})
    with pytest.raises(ValidationError, match="exactly one of `http` or `argv`"):
        fault(apply={"argv": ["true"], "http": {"url": "http://x"}})
    with pytest.raises(ValidationError):
        fault(apply={"argv": ["true"]}, evidence={"http": {"url": "http://x"}})  # json_path missing


def test_params_survive_the_journal_round_trip():
    # The runner journals params with model_dump(mode="json"); cleanup validates them again.
    from pydantic import TypeAdapter

    from chaos.faults import registry

    f = fault(apply={"http": {"url": f"{BASE}/fault/on", "json": {"drop": 1}}})
    dumped = f.params.model_dump(mode="json")
    again = TypeAdapter(registry.fault_union()).validate_python(dumped)
    assert again == f.params and again.apply.http.json_body == {"drop": 1}


def test_a_command_that_leaves_a_process_running_returns_when_it_ends(ctx, tmp_path):
    """The input that showed it (tests/runner/test_heal_and_cleanup.py, final check of
    2026-12-06): a hook that starts a server in the background and exits; the server inherited
    the hook's output pipes, so the apply waited its whole timeout (158 s) instead of returning."""
    import os
    import signal
    import time

    pidfile = tmp_path / "bg.pid"
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
            f"start_new_session=True); open({str(pidfile)!r}, 'w').write(str(p.pid)); print('started')")
    f = fault(apply={"argv": [sys.executable, "-c", code], "timeout_s": 20})
    t0 = time.monotonic()
    try:
        applied = f.apply(ctx)
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert time.monotonic() - t0 < 10
    assert applied["returncode"] == 0 and applied["stdout"] == "started\n"
