"""After kvchaos restarts LMCache under a running engine, the next phase starts only once the
engine uses the new server again (chaos/stack/reconnect.py).

The input that showed it: CI ran scenarios/l2-load-fail-after-lookup.yaml (two LMCache restarts,
for the fault_inject wrapper and back) and its last phase saw no L2 hit at all
(``lmcache_mp_lookup_hit_l2_tokens_total grew by >= 256: not reached (increase 0)``): the fault
slept a fixed 3 s after each restart while the engine's LMCache client, which re-registers its
KV caches only on a heartbeat that saw the outage, had not come back. With the engine's heartbeat
at 8 s the same scenario is inconclusive on every run with the old sleep (the restart falls
between two PINGs, the client never re-registers, LMCache issue 4642); here it must pass.
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import SimpleNamespace

import pytest

from chaos.stack.reconnect import registered_contexts, wait_engine_noticed, wait_engine_reconnected
from kvchaos_support import http_server, run_pooled

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "compose" / "reference.yml"


class _Fake:
    """LMCache's /status and the engine's /metrics, as the stack's two HTTP services answer."""

    def __init__(self) -> None:
        self.contexts = 0
        self.healthy = 1
        self.heartbeats: int | None = None  # the engine's heartbeat gauge; None: not exported
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *_a) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                with fake.lock:
                    if self.path == "/status":
                        body = json.dumps({"registered_non_cuda_instance_ids": list(range(fake.contexts)),
                                           "non_cuda_context_meta": {}}).encode()
                    else:
                        text = (f"# TYPE kvchaos_engine_lmcache_healthy gauge\n"
                                f"kvchaos_engine_lmcache_healthy{{model_name=\"m\"}} {fake.healthy}\n")
                        if fake.heartbeats is not None:
                            text += f"kvchaos_engine_lmcache_heartbeats {fake.heartbeats}\n"
                        body = text.encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

        return H


@pytest.fixture
def fake():
    f = _Fake()
    with http_server(f.handler()) as port:
        base = f"http://127.0.0.1:{port}"
        f.stack = SimpleNamespace(settings=SimpleNamespace(lmcache_http=base, engine_url=base))
        yield f


def _later(seconds: float, fn) -> None:
    t = threading.Timer(seconds, fn)
    t.daemon = True
    t.start()


def test_the_wait_ends_when_the_engine_re_registered_and_stayed_healthy(fake):
    fake.contexts, fake.healthy = 0, 0  # the new server: nothing registered; the engine degraded

    def back() -> None:
        with fake.lock:
            fake.contexts, fake.healthy = 1, 1

    _later(1.0, back)
    t0 = time.monotonic()
    out = wait_engine_reconnected(fake.stack, contexts_before=1, timeout_s=10, stable_s=0.5)
    assert out["reconnected"] is True and out["contexts"] == 1 and out["engine_healthy"] is True
    assert 1.4 <= time.monotonic() - t0 < 5  # the registration, then half a second of health


def test_a_stale_healthy_gauge_does_not_end_the_wait(fake):
    # Right after the restart the engine still says healthy (its heartbeat has not seen the
    # outage) while the new server lists no registration: not reconnected.
    fake.contexts, fake.healthy = 0, 1
    out = wait_engine_reconnected(fake.stack, contexts_before=1, timeout_s=1.0, stable_s=0.2)
    assert out["reconnected"] is False and out["contexts"] == 0 and 1.0 <= out["waited_s"] < 3


def test_a_health_flap_restarts_the_stable_window(fake):
    fake.contexts, fake.healthy = 1, 1

    def flap() -> None:
        with fake.lock:
            fake.healthy = 0
        _later(0.3, lambda: setattr(fake, "healthy", 1))

    _later(0.3, flap)
    out = wait_engine_reconnected(fake.stack, contexts_before=1, timeout_s=10, stable_s=1.0)
    assert out["reconnected"] is True and out["waited_s"] >= 1.5


def test_noticed_waits_for_the_gauge_to_drop(fake):
    fake.healthy = 1
    _later(0.8, lambda: setattr(fake, "healthy", 0))
    out = wait_engine_noticed(fake.stack, timeout_s=10)
    assert out["noticed"] is True and 0.7 <= out["waited_s"] < 5
    fake.healthy = 1
    assert wait_engine_noticed(fake.stack, timeout_s=0.5)["noticed"] is False


def test_an_engine_that_runs_no_heartbeat_is_not_waited_for(fake):
    # An engine that has served nothing through LMCache yet: its client's heartbeats have not
    # started (LMCache starts them with the first lookup, store or retrieve), its gauge stays
    # 1, the restart is never seen and nothing re-registers; both waits used to run 30 s.
    fake.contexts, fake.healthy, fake.heartbeats = 0, 1, 0
    out = wait_engine_noticed(fake.stack, timeout_s=10)
    assert out["noticed"] is False and out["heartbeats"] == 0 and out["waited_s"] < 1
    out = wait_engine_reconnected(fake.stack, contexts_before=1, timeout_s=10, stable_s=0.2)
    assert out["reconnected"] is False and out["heartbeats"] == 0 and out["waited_s"] < 1
    # a heartbeat that runs is waited for, as before
    fake.heartbeats = 1
    _later(0.8, lambda: setattr(fake, "healthy", 0))
    assert wait_engine_noticed(fake.stack, timeout_s=10)["noticed"] is True
    fake.healthy = 1
    _later(0.8, lambda: setattr(fake, "contexts", 1))
    out = wait_engine_reconnected(fake.stack, contexts_before=1, timeout_s=10, stable_s=0.2)
    assert out["reconnected"] is True and out["waited_s"] >= 0.7


def test_an_engine_without_the_gauge_is_not_waited_for(fake):
    stack = SimpleNamespace(settings=SimpleNamespace(lmcache_http=fake.stack.settings.lmcache_http,
                                                     engine_url="http://127.0.0.1:9/none"))
    assert wait_engine_noticed(stack, timeout_s=5) == {"noticed": None, "waited_s": pytest.approx(0, abs=1)}
    fake.contexts = 2
    out = wait_engine_reconnected(stack, contexts_before=2, timeout_s=5, stable_s=3)
    assert out["reconnected"] is True and out["engine_healthy"] is None and out["waited_s"] < 1
    assert registered_contexts("http://127.0.0.1:9") is None


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the reference stack's tmpfs needs root")
def test_l2_fault_inject_restarts_are_seen_by_an_engine_with_a_slow_heartbeat(tmp_path, reference_pool):
    """On the session's pool of reference stacks (tests/conftest.py ``reference_pool``): the
    heartbeat variable restarts the engine with it."""
    text = (REPO / "scenarios" / "l2-load-fail-after-lookup.yaml").read_text()
    text = text.replace("stack: ../compose/reference.yml",
                        'stack: STACK\nvariables: {LMCACHE_HEARTBEAT_INTERVAL: "8"}')
    result, checks = run_pooled(reference_pool, tmp_path, text, STACK, "slow-heartbeat")
    assert checks["evidence"].verdict == "passed", checks["evidence"].summary
    assert result.verdict == "passed", [(c.name, c.summary) for c in result.checks]
    (hist,) = (tmp_path / "run").rglob("history.jsonl")
    history = [json.loads(line) for line in hist.read_text().splitlines()]
    waits = [h["value"]["engine"] for h in history
             if h.get("process") == "nemesis" and h.get("type") == "ok" and h.get("f") in ("apply", "heal")]
    assert len(waits) == 2, waits
    for w in waits:
        assert w["reconnected"] is True and w["outage_noticed"]["noticed"] is True, w


def test_a_stale_context_of_a_killed_engine_is_not_waited_for(fake):
    # Before the restart LMCache listed 2 contexts: the engine's and one of an engine process
    # killed earlier (not reaped yet). The new server lists the live engine's only.
    fake.contexts, fake.healthy = 1, 1
    out = wait_engine_reconnected(fake.stack, contexts_before=2, timeout_s=10, stable_s=0.3)
    assert out["reconnected"] is True and out["waited_s"] < 3
