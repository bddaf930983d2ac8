"""The health probe builds no SSL context per call: each ``httpx.get`` loaded the CA bundle
(about 40 ms of CPU, against under 1 ms for the loopback request), and a stack start-up probes
its six services every 200-500 ms until each is healthy: py-spy of ``kvchaos run
scenarios/smoke.yaml scenarios/lookup-timeout.yaml`` on the 2-core CI machine (2026-12-07) put
2,120 of the kvchaos process's 4,600 busy samples in ``create_ssl_context`` under ``probe``."""

from __future__ import annotations

import http.server
import ssl
import threading

import pytest

from chaos.httppool import ssl_context
from chaos.stack.probe import probe


@pytest.fixture
def server():
    class Quiet(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *_a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_probes_share_one_ssl_context(server, monkeypatch):
    ssl_context()  # the process's context, built once (here, or by whoever probed first)
    built = []
    real = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **k: built.append(1) or real(*a, **k))
    answers = [probe(f"{server}/health")[0] for _ in range(20)] + [probe(f"{server}/other")[0]]
    assert answers == [True] * 20 + [False]
    assert probe("http://127.0.0.1:1/health")[0] is False  # refused: unhealthy, as before
    assert built == []


def test_the_shared_context_verifies_as_the_default_does():
    ctx = ssl_context()
    assert ctx is ssl_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
