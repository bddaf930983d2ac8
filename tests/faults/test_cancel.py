"""cancel: through the runner's Nemesis and the real workload client, against a small real HTTP
server that answers /v1/completions slowly (streamed: one token per 50 ms; not streamed: after
300 ms), so the client has time to abort."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chaos.faults.base import FaultContext
from chaos.faults.registry import build_fault
from chaos.history import HistoryWriter
from chaos.journal import Journal
from chaos.runner.run import Nemesis
from chaos.scenario.model import Scenario
from chaos.workload.client import Cancel, CompletionClient
from chaos.workload.driver import run_conversations
from chaos.workload.generator import plan_phase

TOKEN_S = 0.05
UNSTREAMED_S = 0.3


class SlowEngine(BaseHTTPRequestHandler):
    """A slow completions endpoint in the engine's wire format (docs/architecture.md section 2)."""

    protocol_version = "HTTP/1.1"
    disconnects = 0

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt, n = body["prompt"], body["max_tokens"]
        tokens = [(sum(prompt) + i) % 256 for i in range(n)]
        rid = self.headers.get("X-Request-Id", "x")
        final = {"id": f"cmpl-{rid}", "object": "text_completion", "model": "m",
                 "usage": {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}}
        try:
            if not body.get("stream"):
                time.sleep(UNSTREAMED_S)
                data = json.dumps({**final, "choices": [{"index": 0, "text": "", "token_ids": tokens,
                                                         "finish_reason": "length"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i, t in enumerate(tokens):
                event = {**final, "choices": [{"index": 0, "text": "", "token_ids": [t],
                                               "finish_reason": "length" if i == n - 1 else None}]}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
                time.sleep(TOKEN_S)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            type(self).disconnects += 1


@pytest.fixture(scope="module")
def engine_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowEngine)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def scenario(stream: bool | float, **fault_fields) -> Scenario:
    return Scenario.model_validate(
        {"name": "t", "stack": "s.yml", "seed": 5,
         "workload": {"families": 2, "prefix_tokens": [8], "suffix_tokens": 4, "requests": 8,
                      "concurrency": 4, "max_tokens": 8, "stream": stream},
         "phases": [{"name": "p", "faults": [{"kind": "cancel", "until": "end", **fault_fields}]}],
         "checks": {"evidence": {}}},
        context={"check_paths": False},
    )


def run_window(engine_url: str, sc: Scenario, before: int = 2, after: int = 2):
    """Requests before the window, in it (fault applied through a Nemesis), and after it.

    Returns (history ops, the fault, the heal op's value)."""
    history = HistoryWriter(None)
    journal = Journal(f"cancel-test-{uuid.uuid4().hex[:8]}")
    ctx = FaultContext(history=history, rng=random.Random(sc.seed), phase="p")
    nemesis = Nemesis(ctx, history, journal, None)
    flt = build_fault(sc.phases[0].faults[0])

    async def go() -> None:
        async with CompletionClient(engine_url, history=history) as client:
            w = sc.workload
            if before:
                await run_conversations(client, plan_phase(w, sc.seed, "before", before), phase="before",
                                        concurrency=w.concurrency, cancel_for=nemesis.cancel_for)
            await asyncio.to_thread(nemesis.apply, flt, "p")
            await run_conversations(client, plan_phase(w, sc.seed, "p"), phase="p",
                                    concurrency=w.concurrency, cancel_for=nemesis.cancel_for)
            await asyncio.to_thread(nemesis.heal, nemesis.applied[0])
            if after:
                await run_conversations(client, plan_phase(w, sc.seed, "after", after), phase="after",
                                        concurrency=w.concurrency, cancel_for=nemesis.cancel_for)

    asyncio.run(go())
    ops = history.ops
    (healed,) = [o for o in ops if o.f == "heal" and o.type == "ok"]
    assert journal.open_entries() == []  # the fault entry was removed at heal
    journal.close()
    return ops, flt, healed.value


def outcomes(ops, phase: str):
    return [o for o in ops if o.f == "complete" and o.type != "invoke" and o.phase == phase]


def test_storm_after_first_token_aborts_every_streamed_request(engine_url):
    ops, _flt, healed = run_window(engine_url, scenario(True, storm=True, probability=0.0))
    inside = outcomes(ops, "p")
    assert len(inside) == 8
    assert all(o.type == "info" and o.value["aborted"] and len(o.value["token_ids"]) == 1 for o in inside)
    assert all(o.type == "ok" for o in outcomes(ops, "before") + outcomes(ops, "after"))
    ev = healed["evidence"]
    assert ev["bit"] is True and ev["aborted"] == 8 and ev["picked"] == 8


def test_unstreamed_requests_fall_back_to_after_ms(engine_url):
    ops, _flt, healed = run_window(engine_url, scenario(False, mode="after_first_token", after_ms=50),
                                   before=0, after=0)
    inside = outcomes(ops, "p")
    assert all(o.value["aborted"] and o.value["error"] == "aborted by client after 50 ms" for o in inside)
    assert all(o.value["latency_s"] < UNSTREAMED_S for o in inside)
    assert healed["evidence"]["aborted"] == 8


def test_probability_picks_a_seeded_subset(engine_url):
    ops, flt, healed = run_window(engine_url, scenario(0.5, mode="random", probability=0.5, after_ms=40))
    ev = healed["evidence"]
    aborted = {o.request_id for o in outcomes(ops, "p") if o.value.get("aborted")}
    assert 0 < len(aborted) < 8
    assert ev["bit"] is True and set(ev["aborted_ids"]) == aborted == set(flt._picked)
    # same seed, same picks
    _ops2, flt2, _h2 = run_window(engine_url, scenario(0.5, mode="random", probability=0.5, after_ms=40))
    assert flt2._picked == flt._picked


def test_a_window_that_aborted_nothing_did_not_bite(engine_url):
    ops, _flt, healed = run_window(engine_url, scenario(False, mode="after_ms", probability=0.0), before=0, after=0)
    assert all(o.type == "ok" for o in outcomes(ops, "p"))
    ev = healed["evidence"]
    assert ev["bit"] is False and ev["aborted"] == 0 and ev["reason"] == "no request was picked (probability 0)"


def test_cancel_for_outside_the_window_is_none():
    sc = scenario(True, mode="after_ms", after_ms=10)
    flt = build_fault(sc.phases[0].faults[0])
    ctx = FaultContext(history=HistoryWriter(None))
    plan = plan_phase(sc.workload, sc.seed, "p", 1)[0].turns[0]
    assert flt.cancel_for(plan, ctx) is None
    flt.apply(ctx)
    assert flt.cancel_for(plan, ctx) == Cancel(after_ms=10, report_landing=True)
    flt.heal(ctx)
    assert flt.cancel_for(plan, ctx) is None


def test_picked_requests_that_finish_first_did_not_bite(engine_url):
    ops, _flt, healed = run_window(engine_url, scenario(False, mode="after_ms", after_ms=5000), before=0, after=0)
    assert all(o.type == "ok" for o in outcomes(ops, "p"))
    ev = healed["evidence"]
    assert ev["bit"] is False and ev["picked"] == 8 and "finished first" in ev["reason"]


def _evidence_after(fault: dict, cancels: list[dict | None]):
    """The evidence of a storm cancel ``fault`` after requests whose cancel went as ``cancels``
    say (a dict: the ``cancel`` value the client recorded; None: the request ended normally)."""
    sc = Scenario.model_validate(
        {"name": "t", "stack": "s.yml", "workload": {"requests": len(cancels), "stream": True},
         "phases": [{"name": "p", "faults": [{"kind": "cancel", "storm": True, "until": "end", **fault}]}],
         "checks": {"evidence": {}}}, context={"check_paths": False})
    flt = build_fault(sc.phases[0].faults[0])
    history = HistoryWriter(None)
    ctx = FaultContext(history=history)
    flt.apply(ctx)
    for conv, cancel in zip(plan_phase(sc.workload, 0, "p"), cancels):
        plan = conv.turns[0]
        assert flt.cancel_for(plan, ctx) is not None
        history.append("client-0", "invoke", "complete", phase="p", request_id=plan.request_id, value={})
        aborted = bool(cancel and cancel.get("reached"))
        history.append("client-0", "info" if aborted else "ok", "complete", phase="p", request_id=plan.request_id,
                       value={"aborted": aborted, "cancel": cancel or {"reached": False}})
    flt.heal(ctx)
    return flt.evidence(ctx)


def _at_state_evidence(landings: list[dict | None]):
    """The at_state (load) fault's evidence after requests whose cancel went as ``landings`` say."""
    return _evidence_after({"mode": "at_state", "state": "load"},
                           [None if c is None else {"at_state": "load", **c} for c in landings])


def test_at_state_counts_only_aborts_that_landed_in_the_state():
    ev = _at_state_evidence([{"reached": True, "landed_in": "load"}, {"reached": True, "landed_in": "prefill"},
                             None])
    assert ev["bit"] is True and ev["landed"] == {"load": 1, "prefill": 1} and ev["never_reached"] == 1


def test_at_state_that_landed_elsewhere_or_was_never_reached_did_not_bite():
    ev = _at_state_evidence([{"reached": True, "landed_in": "prefill"}, {"reached": True, "landed_in": "decode"}])
    assert ev["bit"] is False and ev["reason"] == "no abort landed in state load: they landed in decode (1), prefill (1)"
    ev = _at_state_evidence([None, None, {"reached": True, "landed_in": None}])
    assert ev["bit"] is False
    assert ev["reason"] == "no picked request reached state load (2 never entered it, 1 ended before the abort arrived)"


def test_at_state_needs_a_state():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="mode at_state needs `state`"):
        Scenario.model_validate({"name": "t", "stack": "s.yml", "phases": [{"name": "p", "faults": [
            {"kind": "cancel", "mode": "at_state", "until": "end"}]}], "checks": {"evidence": {}}},
            context={"check_paths": False})


def test_timed_aborts_ask_where_they_landed_and_an_engine_without_a_view_answers_at_once(engine_url):
    # the slow engine has no request view (HTTP 501 to GET): each abort is "not located", at once
    t0 = time.monotonic()
    ops, _flt, healed = run_window(engine_url, scenario(False, mode="after_ms", after_ms=50), before=0, after=0)
    inside = outcomes(ops, "p")
    assert inside and all(o.value["cancel"]["timed"] and o.value["cancel"]["landed_in"] is None
                          and "no view of this request" in o.value["cancel"]["reason"] for o in inside)
    assert time.monotonic() - t0 < 5  # not ABORT_LANDING_S per request
    ev = healed["evidence"]
    assert ev["bit"] is True and ev["landed"] == {} and ev["landed_in_lmcache_call"] == 0 and ev["unlanded"] == 8


def _params(fault: dict):
    sc = Scenario.model_validate(
        {"name": "t", "stack": "s.yml", "phases": [{"name": "p", "faults": [{"until": "end", **fault}]}],
         "checks": {"evidence": {}}}, context={"check_paths": False})
    return sc.phases[0].faults[0]


@pytest.mark.parametrize("holder", [
    {"kind": "latency", "link": "engine-lmcache", "latency_ms": 300},
    {"kind": "timeout", "link": "lmcache-redis", "timeout_ms": 0},
    {"kind": "link_down", "link": "engine-lmcache"},
    {"kind": "pause", "service": "lmcache"},
    {"kind": "pause", "service": "redis"},
])
def test_a_cancel_beside_a_fault_that_holds_lmcache_aims_at_its_calls(holder):
    from chaos.faults.cancel import CancelFault

    for mode in ({"mode": "after_ms", "after_ms": 300}, {"mode": "after_first_token"}, {"mode": "random"}):
        d = CancelFault.default_trigger_beside(_params({"kind": "cancel", **mode}), [_params(holder)])
        assert d.evidence_field == "landed_in_lmcache_call" and d.needs == {"engine.debug_state"}, (mode, d)
        assert holder["kind"] in d.text
    # aimed at a state: its own default, whatever is beside it
    d = CancelFault.default_trigger_beside(_params({"kind": "cancel", "mode": "at_state", "state": "decode"}),
                                           [_params(holder)])
    assert d.evidence_field is None and "landed in state decode" in d.text


@pytest.mark.parametrize("other", [
    None,
    {"kind": "pause", "service": "engine"},
    {"kind": "latency", "link": "client-engine", "latency_ms": 300},
    {"kind": "l2_corrupt", "mode": "delete", "target": "redis"},
])
def test_a_cancel_beside_nothing_that_holds_lmcache_keeps_the_plain_default(other):
    from chaos.faults.cancel import CancelFault

    params = _params({"kind": "cancel", "mode": "after_ms", "after_ms": 300})
    d = CancelFault.default_trigger_beside(params, [] if other is None else [_params(other)])
    assert d == CancelFault.default_trigger(params) and d.evidence_field is None


def _timed_evidence(landed_in: list[str | None]):
    """The evidence of a cancel ``after_ms`` whose aborts the engine located as ``landed_in``."""
    return _evidence_after({"mode": "after_ms", "after_ms": 300},
                           [{"timed": True, "reached": True, "landed_in": w} for w in landed_in])


def test_timed_aborts_that_landed_after_the_lmcache_calls_did_not_reach_them():
    ev = _timed_evidence(["decode", "prefill", None])
    assert ev["bit"] is True and ev["landed"] == {"decode": 1, "prefill": 1} and ev["landed_in_lmcache_call"] == 0
    ev = _timed_evidence(["lookup", "decode", "load"])
    assert ev["landed_in_lmcache_call"] == 2
