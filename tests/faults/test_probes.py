"""Trigger probes (chaos/probes.py): Prometheus samples, JSON numbers and log lines of a stack's
services, watched from apply to heal. Real HTTP servers and a real (not started) LocalStack for
the service names, addresses and log folder."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
from pydantic import ValidationError

from chaos.probes import Condition, TriggerWatch, resolve_service, trigger_problems
from kvchaos_support import http_server, local_stack

STACK = """
services:
  engine: {command: [sleep, "300"]}
  cache: {command: [sleep, "300"]}
  other: {command: [sleep, "300"]}
x-kvchaos:
  engine: engine
  engine_url: http://127.0.0.1:${ENGINE_PORT:-0}
  lmcache: cache
  lmcache_http: http://127.0.0.1:${CACHE_PORT:-0}
"""


class Counters:
    """What the fake endpoints answer; changed by the tests while a watch runs."""

    def __init__(self) -> None:
        self.counter = 10.0
        self.gauge = 0.0
        self.lock = threading.Lock()
        self.served = {"/metrics": 0, "/status": 0}  # answers given, per path

    def change(self, paths: tuple[str, ...] = ("/metrics",), **values: float) -> None:
        """Set ``values``, then wait until each of ``paths`` was answered once with them: a
        sample that saw the change (an event; a sleep of a few sampling periods is outlasted
        on a loaded host, where the sampler thread may not run for 300 ms)."""
        with self.lock:
            for k, v in values.items():
                setattr(self, k, v)
            seen = {p: self.served[p] for p in paths}
        deadline = time.monotonic() + 60
        while any(self.served[p] <= n for p, n in seen.items()):
            assert time.monotonic() < deadline, f"no sample of {paths} after the change to {values}"
            time.sleep(0.01)


def handler_for(state: Counters) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def do_GET(self):
            with state.lock:
                if self.path in state.served:
                    state.served[self.path] += 1
                if self.path == "/metrics":
                    body = ("# TYPE x_failures_total counter\n"
                            f'x_failures_total{{reason="not_found"}} {state.counter}\n'
                            f'x_failures_total{{reason="l1_oom"}} 100\n'
                            "# TYPE x_locked gauge\n"
                            f"x_locked {state.gauge}\n").encode()
                    ctype = "text/plain; version=0.0.4"
                elif self.path == "/status":
                    body = json.dumps({"l1": {"locked": state.gauge, "name": "x"},
                                       "count": state.counter}).encode()
                    ctype = "application/json"
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    return H


@pytest.fixture
def served(tmp_path):
    state = Counters()
    with http_server(handler_for(state)) as port:
        stack = local_stack(tmp_path, STACK, ENGINE_PORT=str(port), CACHE_PORT=str(port))
        yield state, stack


def cond(**kw) -> Condition:
    return Condition.model_validate(kw)


def test_counter_growth_with_labels_and_a_reset(served):
    state, stack = served
    c = cond(metric="x_failures_total", labels={"reason": "not_found"}, service="lmcache", grew_by=5)
    w = TriggerWatch([c], stack, every_s=0.05)
    w.begin()
    w.start()
    state.change(counter=13.0)        # +3
    state.change(counter=1.0)         # the service restarted: counting goes on from 0 (+1)
    state.change(counter=2.0)         # +1: 5 in all, although the final value is below the baseline
    r = w.finish()
    (row,) = r["conditions"]
    assert row["baseline"] == 10.0 and row["final"] == 2.0
    assert row["increase"] == 5.0 and r["reached"] is True, r
    assert row["service"] == "cache"  # the role `lmcache` is the stack's service `cache`


def test_gauge_peak_is_seen_by_sampling_not_only_at_heal(served):
    state, stack = served
    w = TriggerWatch([cond(metric="x_locked", service="lmcache", reached=3),
                      cond(json="l1.locked", url="/status", service="engine", reached=3)], stack, every_s=0.05)
    w.begin()
    w.start()
    state.change(("/metrics", "/status"), gauge=4.0)
    state.change(("/metrics", "/status"), gauge=0.0)  # back to 0 before heal
    r = w.finish()
    assert [c["max"] for c in r["conditions"]] == [4.0, 4.0]
    assert [c["final"] for c in r["conditions"]] == [0.0, 0.0]
    assert r["reached"] is True


def test_not_reached_when_nothing_changed(served):
    _state, stack = served
    w = TriggerWatch([cond(metric="x_failures_total", service="lmcache", grew_by=1)], stack, every_s=0.05)
    w.begin()
    w.start()
    time.sleep(0.2)
    r = w.finish()
    assert r["reached"] is False and r["conditions"][0]["increase"] == 0.0


def test_a_metric_never_exported_reads_as_zero_and_says_so(served):
    _state, stack = served
    w = TriggerWatch([cond(metric="x_typo_total", service="lmcache", grew_by=1)], stack, every_s=0.05)
    w.begin()
    r = w.finish()
    assert r["reached"] is False and "no sample named x_typo_total" in r["conditions"][0]["note"]


def test_an_unreachable_endpoint_is_never_a_pass(tmp_path):
    stack = local_stack(tmp_path, STACK, ENGINE_PORT="9", CACHE_PORT="9")  # nothing listens on 9
    w = TriggerWatch([cond(json="count", url="/status", service="engine", reached=0)], stack, every_s=0.05)
    w.begin()
    w.start()
    time.sleep(0.15)
    r = w.finish()
    assert r["reached"] is False and r["conditions"][0]["errors"]


def test_a_json_value_that_is_not_a_number(served):
    _state, stack = served
    w = TriggerWatch([cond(json="l1.name", url="/status", service="engine", reached=0)], stack)
    w.begin()
    r = w.finish()
    assert r["reached"] is False and "not a number" in r["conditions"][0]["errors"][-1]


def test_log_lines_written_while_in_place(tmp_path):
    stack = local_stack(tmp_path, STACK)
    log = stack.log_dir / "engine.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("hook: stalling 1.00s at before_retrieve (before the fault: not counted)\n")
    w = TriggerWatch([cond(log=r"hook: stalling .* at before_retrieve", service="engine", matched=2)], stack)
    w.begin()
    with log.open("a") as f:
        f.write("INFO request r1\nWARNING hook: stalling 2.00s at before_retrieve\n")
    assert w.finish()["reached"] is False  # one new line, two wanted
    w2 = TriggerWatch([cond(log="hook: stalling", service="engine")], stack)
    w2.begin()
    with log.open("a") as f:
        f.write("WARNING hook: stalling 2.00s at before_store\n")
    r = w2.finish()
    assert r["reached"] is True and r["conditions"][0]["matched"] == 1
    assert "before_store" in r["conditions"][0]["lines"][0]


@pytest.mark.parametrize("fields,message", [
    ({"service": "engine", "grew_by": 1}, "exactly one of `metric`, `json` or `log`"),
    ({"metric": "a", "log": "b", "service": "engine", "grew_by": 1}, "not metric and log"),
    ({"metric": "a", "service": "engine"}, "exactly one of `grew_by: N`"),
    ({"metric": "a", "service": "engine", "grew_by": 1, "reached": 2}, "exactly one of `grew_by: N`"),
    ({"json": "a.b", "service": "engine", "reached": 1}, "needs `url`"),
    ({"log": "(", "service": "engine"}, "not a regular expression"),
    ({"log": "x", "service": "engine", "grew_by": 1}, "use `matched: N`"),
    ({"metric": "a", "service": "engine", "matched": 1, "grew_by": 1}, "`matched` is for `log`"),
])
def test_condition_validation(fields, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace("`", "`")):
        Condition.model_validate(fields)


def test_services_are_roles_or_compose_names(tmp_path):
    stack = local_stack(tmp_path, STACK)
    s, services = stack.settings, set(stack.spec.services)
    assert resolve_service("lmcache", s, services) == "cache"
    assert resolve_service("cache", s, services) == "cache"
    with pytest.raises(ValueError, match="unknown service 'redis'"):
        resolve_service("redis", s, services)  # a role this stack does not fill
    bad = [cond(metric="a", service="nope", grew_by=1),
           cond(json="a", url="/x", service="engine", reached=1),
           cond(json="a", url="/x", service="cache", reached=1),
           cond(log="x", service="recompute"),
           cond(metric="a", service="other", grew_by=1),
           cond(metric="a", service="other", url="http://127.0.0.1:${OTHER_PORT}/metrics", grew_by=1)]
    problems = trigger_problems(bad, s, services)
    assert [p for p, _ in problems] == [(0, "service"), (3, "service"), (4, "url")]
    assert "has no HTTP address" in problems[2][1]


def test_several_metric_names_are_summed(served):
    state, stack = served
    c = cond(metric=["x_failures_total", "x_locked"], service="lmcache", grew_by=4)
    w = TriggerWatch([c], stack, every_s=0.05)
    w.begin()
    w.start()
    state.counter += 2
    state.gauge = 2
    time.sleep(0.2)
    r = w.finish()
    assert r["reached"] is True and r["conditions"][0]["increase"] == 4.0
    assert "x_failures_total+x_locked" in r["conditions"][0]["condition"]


def test_only_with_watches_a_condition_only_where_the_stack_offers_it(served):
    """A condition ``only_with`` a capability the stack lacks is not read, reported not
    applicable, and never counted as reached; the trigger is decided by the others."""
    state, stack = served
    assert "engine.kvchaos_metrics" not in stack.spec.capabilities()
    gated = cond(metric="x_failures_total", service="engine", grew_by=100, only_with="engine.kvchaos_metrics")
    live = cond(metric="x_failures_total", labels={"reason": "not_found"}, service="lmcache", grew_by=1,
                only_with="lmcache.http")  # derived from lmcache_http: offered
    w = TriggerWatch([gated, live], stack, every_s=0.05)
    w.begin()
    w.start()
    state.counter += 2
    time.sleep(0.2)
    r = w.finish()
    off, on = r["conditions"]
    assert off["applicable"] is False and off["reached"] is False and "samples" not in off
    assert "not applicable on this stack" in off["note"] and "engine.kvchaos_metrics" in off["note"]
    assert on["applicable"] is True and on["reached"] is True
    assert r["reached"] is True, r
    assert "[only with engine.kvchaos_metrics]" in off["condition"]


def test_only_with_on_a_stack_that_offers_it_must_be_reached(served):
    state, stack = served
    gated = cond(metric="x_failures_total", service="engine", grew_by=100, only_with="engine.kvchaos_metrics")
    other = cond(metric="x_failures_total", service="lmcache", grew_by=1)
    w = TriggerWatch([gated, other], stack, every_s=0.05,
                     capabilities=stack.spec.capabilities() | {"engine.kvchaos_metrics"})
    w.begin()
    w.start()
    state.counter += 2                # grows by 2: `other` reached, `gated` (100) not
    time.sleep(0.2)
    r = w.finish()
    assert [c["applicable"] for c in r["conditions"]] == [True, True]
    assert [c["reached"] for c in r["conditions"]] == [False, True]
    assert r["reached"] is False


def test_a_trigger_whose_every_condition_is_inapplicable_is_never_reached(served):
    """Nothing watched must never read as reached: the evidence check says inconclusive."""
    from chaos.checks.evidence import check

    state, stack = served
    w = TriggerWatch([cond(log="anything", service="engine", only_with="engine.kvchaos_metrics"),
                      cond(metric="x_locked", service="engine", reached=0, only_with="engine.debug_state")],
                     stack, every_s=0.05)
    w.begin()
    w.start()
    state.counter += 5
    r = w.finish()
    assert r["reached"] is False and "no condition of this trigger applies" in r["note"]
    op = {"process": "nemesis", "type": "ok", "f": "trigger", "phase": "p", "value": r}
    result = check([op], None)
    assert result.verdict == "unknown", result
    assert "no condition applies on this stack" in result.summary


def test_only_with_names_a_known_capability():
    with pytest.raises(ValidationError, match="only_with: unknown capability 'engine.kvchaos_metric'"):
        Condition.model_validate({"metric": "a", "service": "engine", "grew_by": 1,
                                  "only_with": "engine.kvchaos_metric"})


def test_inapplicable_conditions_are_not_checked_against_the_stack(tmp_path):
    stack = local_stack(tmp_path, STACK)
    s, services = stack.settings, set(stack.spec.services)
    bad = [cond(metric="a", service="nope", grew_by=1, only_with="engine.kvchaos_metrics")]
    assert trigger_problems(bad, s, services, stack.spec.capabilities()) == []
    assert [p for p, _ in trigger_problems(bad, s, services)] == [(0, "service")]
