"""The journal records each add and each undo once, and open_entries() is what is left."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from chaos.journal import Journal, open_entries
from kvchaos_support import local_stack


def lines(j: Journal) -> list[dict]:
    """The journal's entries (not the owner lines)."""
    return [e for e in (json.loads(x) for x in j.path.read_text().splitlines()) if e["op"] != "owner"]


def test_open_entries_are_added_and_not_removed(tmp_path):
    j = Journal("r", directory=tmp_path)
    j.add("process", "a:1", pid=1)
    j.add("mount", "/m", path="/m")
    j.remove("process", "a:1")
    assert [(e["kind"], e["key"]) for e in open_entries(j.path)] == [("mount", "/m")]
    j.remove("mount", "/m")
    j.close()
    assert not j.path.exists()


def test_a_repeated_remove_is_written_once_and_a_re_add_opens_it_again(tmp_path):
    j = Journal("r", directory=tmp_path)
    j.add("process", "a:1", pid=1)
    for _ in range(5):
        j.remove("process", "a:1")
    assert [e["op"] for e in lines(j)] == ["add", "remove"]
    j.add("process", "a:1", pid=1)  # the same key again (a restarted service reusing a pid)
    assert open_entries(j.path) != []
    j.remove("process", "a:1")
    assert [e["op"] for e in lines(j)] == ["add", "remove", "add", "remove"]
    assert open_entries(j.path) == []


def test_status_polls_of_a_killed_service_write_one_remove(tmp_path):
    """The input that showed it: each status() of a dead service appended (and fsynced) another
    remove line for it; a journal of the reference stack held six for one LMCache kill."""
    stack = local_stack(tmp_path, "services:\n  idle:\n    command: [sleep, '300']\n    stop_signal: SIGKILL\n")
    with stack:
        pid = stack.status()["idle"].pid
        stack.kill("idle")
        for _ in range(5):
            stack.status()
        removes = [e for e in lines(stack.journal) if e["op"] == "remove" and e["key"] == f"idle:{pid}"]
        assert len(removes) == 1


def test_a_hung_child_killed_by_the_test_support_leaves_nothing(tmp_path):
    """tests/kvchaos_support.communicate_or_dump: a `kvchaos` child that never ends is killed and
    the test fails; before, what it had started stayed (in CI a hung SIGINT test left a tmpfs L2
    disk mounted and its folder unremovable). Now its journal is cleaned up after the kill."""
    from _pytest.outcomes import Failed

    from kvchaos_support import communicate_or_dump

    state = tmp_path / "state"
    child = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time, psutil\n"
        "from chaos.journal import Journal\n"
        "j = Journal('hung-run')\n"
        "p = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "j.add('process', f'sleeper:{p.pid}', pid=p.pid, pgid=p.pid,\n"
        "      create_time=psutil.Process(p.pid).create_time(), service='sleeper')\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n")], env=dict(os.environ, KVCHAOS_STATE_DIR=str(state)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sleeper = int(child.stdout.readline())
    try:
        with pytest.raises(Failed) as ei:
            communicate_or_dump(child, 1, state)
        assert "did not end within 1s" in str(ei.value) and "kvchaos cleanup (exit 0)" in str(ei.value)
        assert child.poll() is not None
        assert not psutil.pid_exists(sleeper) or psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE
    finally:
        if psutil.pid_exists(sleeper):
            os.kill(sleeper, 9)


def test_cleanup_of_a_fault_whose_proxy_is_gone_is_no_error(tmp_path):
    """The input: `kvchaos cleanup` after a host ended a run and its whole stack at once (the
    runner and the proxy both killed) exited 1 with "ToxiproxyError: ... Connection refused"
    for a toxic that died with its proxy. Nothing listens on the journalled API port (a socket
    bound there without listen() refuses connections and keeps the port from anyone else)."""
    import socket

    from pydantic import TypeAdapter

    from chaos.cleanup import cleanup
    from chaos.faults import registry
    from chaos.scenario.model import FaultSpec  # noqa: F401  (loads the fault modules)

    params = TypeAdapter(registry.fault_union()).validate_python(
        {"kind": "latency", "name": "slow-link", "link": "cache-link", "latency_ms": 50, "until": "end"})
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        j = Journal("r", directory=tmp_path)
        j.add("fault", "slow-link", fault_kind="latency", params=params.model_dump(mode="json"),
              proxy_api=f"http://127.0.0.1:{held.getsockname()[1]}", stack_env={})
        report = cleanup(tmp_path, force=["r"])
    assert report.errors == []
    assert report.undone == ["fault slow-link (latency): its proxy is gone, nothing to heal"]
    assert not j.path.exists()


def test_cleanup_of_a_fault_whose_proxy_answers_an_error_keeps_the_journal(tmp_path):
    """A proxy that answers (here HTTP 500 on every call) may still hold the toxic: an error,
    and the journal stays for the next cleanup."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from pydantic import TypeAdapter

    from chaos.cleanup import cleanup
    from chaos.faults import registry
    from chaos.scenario.model import FaultSpec  # noqa: F401

    class Broken(BaseHTTPRequestHandler):
        def _fail(self):
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": "broken", "status": 500}')

        do_GET = do_POST = do_DELETE = _fail

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        params = TypeAdapter(registry.fault_union()).validate_python(
            {"kind": "latency", "name": "slow-link", "link": "cache-link", "latency_ms": 50, "until": "end"})
        j = Journal("r", directory=tmp_path)
        j.add("fault", "slow-link", fault_kind="latency", params=params.model_dump(mode="json"),
              proxy_api=f"http://127.0.0.1:{server.server_address[1]}", stack_env={})
        report = cleanup(tmp_path, force=["r"])
    finally:
        server.shutdown()
        server.server_close()
    assert len(report.errors) == 1 and "HTTP 500" in report.errors[0], report
    assert j.path.exists()
