"""The engine-hook fault kinds `stall` and `lmcache_call`.

Fast: their settings, what they need from a stack (the GPU stack refuses them), evidence before
anything was applied, a stack without an engine. Slow, on the whole reference stack (one stack
for the module, reset between scenarios as a suite does; about 4 minutes):

- stall: with warm prefixes the engine is held before its retrieve and the log proves it; the
  planted bug short-free-after-failed-load is caught (leaks) when a slow link makes the held
  retrieve be dropped (the window of scenarios/retrieve-dropped-slow-link.yaml); without a warm
  phase no lookup hits, nothing reaches before_retrieve: inconclusive.
- lmcache_call: free_lookup_locks for an unknown request acts and shows LMCache's finding (a
  session left open: leaks fails); lookup_then_end_session on a quiet link never reaches its
  window (the LOOKUP is acknowledged in time): inconclusive.

The two inconclusive cases share one run, a phase each (the ``outside`` fixture). The two runs
that leak on purpose come last: after a run whose ``leaks`` check fails the pool
starts the whole stack afresh (chaos/runner/stacks.py), and before them each run checks
``leaks`` too, so what a leak-catching run sees is its own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from chaos.faults.base import FaultContext
from chaos.faults.stall import stall_line
from kvchaos_support import fault, local_stack, run_pooled, scenario_text

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "compose" / "reference.yml"


# ---- fast ---------------------------------------------------------------------------------
def test_settings_are_checked():
    f = fault("stall", point="before_lookup", seconds="1500ms", count=3)
    assert (f.params.point, f.params.seconds, f.params.count) == ("before_lookup", 1.5, 3)
    for bad in ({"point": "after_lunch"}, {"seconds": 0}, {"seconds": "3m"}, {"count": 0}):
        with pytest.raises(ValidationError):
            fault("stall", **bad)
    c = fault("lmcache_call", call="free_lookup_locks", request_id="ghost-0")
    assert c.params.tokens == 512
    for bad in ({"call": "drop_everything", "request_id": "x"}, {"call": "free_lookup_locks"},
                {"call": "free_lookup_locks", "request_id": "has space"},
                {"call": "free_lookup_locks", "request_id": "x", "tokens": 0}):
        with pytest.raises(ValidationError):
            fault("lmcache_call", **bad)


def test_the_log_line_is_the_engines_and_not_the_clearing_stall():
    line = stall_line("before_retrieve")
    assert line.search("WARNING hook: stalling 6.00s at before_retrieve")
    assert not line.search("WARNING hook: stalling 0.00s at before_retrieve")
    assert not line.search("WARNING hook: stalling 6.00s at before_lookup")


def test_what_they_need_refuses_the_gpu_stack(tmp_path: Path):
    from chaos.scenario.loader import load_scenario, validate_against_stack
    from chaos.stack.spec import load_stack
    from chaos.yamlsource import ConfigError

    path = tmp_path / "s.yaml"
    path.write_text(f"""name: s
stack: {STACK}
phases:
  - name: p
    faults:
      - {{kind: stall, duration: 1s}}
      - {{kind: lmcache_call, call: free_lookup_locks, request_id: g, duration: 1s}}
checks: {{evidence: {{}}}}
""")
    scenario = load_scenario(path)
    ref = load_stack(STACK, allocate_ports=False, require_commands=False)
    assert {"engine.hooks.stall", "engine.hooks.lmcache"} <= ref.capabilities()
    gpu = load_stack(REPO / "compose" / "vllm-lmcache.yml", allocate_ports=False, require_commands=False)
    with pytest.raises(ConfigError) as err:
        validate_against_stack(scenario, set(), set(gpu.services), capabilities=gpu.capabilities(),
                               stack_name="vllm-lmcache.yml")
    text = "\n".join(err.value.problems)
    assert "s.yaml:6: phases[0].faults[0]: fault 'stall-0' (stall) needs engine.hooks.stall" in text
    assert "s.yaml:7: phases[0].faults[1]: fault 'lmcache_call-1' (lmcache_call) needs engine.hooks.lmcache" in text


def test_no_engine_fails_apply_and_nothing_bit(tmp_path: Path):
    stack = local_stack(tmp_path, "services:\n  idle: {command: [sleep, '1']}\n")
    ctx = FaultContext(stack=stack)
    for f in (fault("stall"), fault("lmcache_call", call="free_lookup_locks", request_id="g")):
        with pytest.raises(RuntimeError, match="engine"):
            f.apply(ctx)
        f.heal(ctx)
        ev = f.evidence(ctx)
        assert ev["bit"] is False and "never" in ev["reason"], ev


# ---- slow: the reference stack -------------------------------------------------------------
def run(pool, tmp_path: Path, text: str):
    return run_pooled(pool, tmp_path, text, STACK, f"hooks-{tmp_path.name}")


DROP_WORKLOAD = "{families: 1, prefix_tokens: [1100], suffix_tokens: 16, requests: 1, concurrency: 1, max_tokens: 16}"
DROP_PHASES = """\
  - name: warm
  - name: slow-link
    requests: 3
    faults:
      - {kind: stall, name: hold, point: before_retrieve, seconds: 6s, count: 1, duration: 14s}
      - kind: latency
        link: engine-lmcache
        latency_ms: 3000
        start: 1500ms
        duration: 12s
        trigger: {log: "retrieve \\\\S+ dropped by the adapter", service: engine}
"""


CALL_WORKLOAD = "{families: 1, prefix_tokens: [512], suffix_tokens: 8, requests: 1, concurrency: 1, max_tokens: 2}"


@pytest.fixture(scope="module")
def outside(pool, tmp_path_factory):
    """One run for both kinds' inconclusive claims, a phase each: lookup_then_end_session on a
    quiet link (no request: the LOOKUP is acknowledged in time, the trigger is never reached),
    then a stall before_retrieve that no request reaches (novel prompts only: no lookup hits,
    nothing is retrieved). Each fault's own row of the evidence says what it did, so each claim
    is proven on its own; one run instead of two."""
    phases = """  - name: quiet-link
    requests: 0
    faults:
      - kind: lmcache_call
        call: lookup_then_end_session
        request_id: ghost-test-1
        duration: 3s
        trigger: {log: "LOOKUP to .* timed out after", service: engine}
  - name: cold
    faults:
      - {kind: stall, point: before_retrieve, seconds: 2s, count: 1, until: end}
"""
    workload = "{families: 2, prefix_tokens: [0], suffix_tokens: 300, requests: 2, concurrency: 2, max_tokens: 4}"
    result, got = run(pool, tmp_path_factory.mktemp("outside"), scenario_text(
        "outside-windows", phases, workload=workload, checks="  leaks: {quiesce_s: 5}\n  evidence: {}\n"))
    ev = got["evidence"]
    assert ev.verdict == "unknown" and result.exit_code == 4, ev.summary
    # the session lookup_then_end_session opened is ended; the stall held nothing
    assert got["leaks"].verdict == "passed", got["leaks"].summary
    assert "faults acted: 1 of 2" in ev.summary, ev.summary
    return {row["kind"]: row for row in ev.details["faults"]}


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the reference stack's tmpfs needs root")
def test_lmcache_call_outside_its_window_is_inconclusive(outside):
    row = outside["lmcache_call"]
    assert row["acted"] is True and row["trigger_reached"] is False, row
    assert row["problem"].startswith("trigger "), row  # it acted; its window was never reached


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the reference stack's tmpfs needs root")
def test_stall_that_no_request_reaches_is_inconclusive(outside):
    row = outside["stall"]
    assert row["acted"] is False and row["applied_at"] is not None, row
    assert "no request reached before_retrieve" in row["evidence"]["reason"], row


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the reference stack's tmpfs needs root")
def test_stalls_a_raw_hook_left_armed_do_not_hold_the_next_scenario(pool, tmp_path):
    """Input that showed it: a raw ``hook`` fault (POST /hooks/stall, as findings and
    tests/checks/test_bites_on_reference_stack.py write it) armed more holds than its requests
    used; reset_stack left them armed and the next scenario on the reused stack was held (here
    20 s before each of its first lookups: liveness failed on a clean engine)."""
    arm = """  - name: arm
    requests: 0
    faults:
      - kind: hook
        name: arm-lookup-stalls
        service: engine
        apply: {http: {url: "http://127.0.0.1:${ENGINE_PORT}/hooks/stall", json: {point: before_lookup, seconds: 20, count: 5}}}
        evidence: {argv: ["true"]}
        duration: 200ms
"""
    workload = "{families: 2, prefix_tokens: [0], suffix_tokens: 64, requests: 2, concurrency: 2, max_tokens: 4}"
    (tmp_path / "arm").mkdir()
    (tmp_path / "next").mkdir()
    run(pool, tmp_path / "arm", scenario_text("stall-arm", arm, workload=workload, checks="  evidence: {}\n"))
    result, got = run(pool, tmp_path / "next", scenario_text(
        "after-armed-stalls", "  - name: cold\n", workload=workload,
        checks="  liveness: {request_deadline_s: 15}\n  recompute_equivalence: {}\n"))
    assert got["liveness"].verdict == "passed", got["liveness"].summary


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the reference stack's tmpfs needs root")
def test_stall_opens_the_dropped_retrieve_window_and_catches_a_short_free(pool, tmp_path):
    checks = "  liveness: {request_deadline_s: 60}\n  leaks: {quiesce_s: 15}\n  evidence: {}\n"
    result, got = run(pool, tmp_path, scenario_text("stall-bug", DROP_PHASES, bugs="[short-free-after-failed-load]",
                                                workload=DROP_WORKLOAD, checks=checks,
                                                variables='{ENGINE_NUM_BLOCKS: "256"}'))
    assert got["evidence"].verdict == "passed", got["evidence"].summary
    assert got["leaks"].verdict == "failed", got["leaks"].summary


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the reference stack's tmpfs needs root")
def test_lmcache_call_acts_and_shows_the_session_it_leaves(pool, tmp_path):
    phases = """  - name: free-unknown
    requests: 0
    faults:
      - kind: lmcache_call
        call: free_lookup_locks
        request_id: ghost-test-0
        duration: 2s
        trigger: {log: "free_lookup_locks for request ghost-test-0 without a lookup result", service: lmcache}
"""
    result, got = run(pool, tmp_path, scenario_text("call-free", phases, workload=CALL_WORKLOAD,
                                                checks="  leaks: {quiesce_s: 5}\n  evidence: {}\n"))
    assert got["evidence"].verdict == "passed", got["evidence"].summary
    assert got["evidence"].summary == "faults acted: 1 of 1 (lmcache_call-0); triggers reached: 1 of 1"
    # LMCache 0.5.6's finding (docs/findings/free-lookup-locks-creates-session.md)
    assert got["leaks"].verdict == "failed" and "active_sessions" in got["leaks"].summary, got["leaks"].summary
