"""`kvchaos validate` warns about every fault and phase whose window nothing proves (issue 34):
a `trigger: none`, a default trigger the phase's requests cannot reach, one that needs what the
stack lacks; `trigger: none` needs a `reason`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from chaos.scenario.cli import app
from chaos.scenario.loader import load_scenario
from chaos.scenario.windows import window_warnings

from .samples import GOOD

runner = CliRunner()
REFERENCE = Path(__file__).resolve().parents[2] / "compose" / "reference.yml"
NAME = "lookup-stall.yaml"


@pytest.fixture
def write_as(write):
    """write_as(text) -> the scenario file, named as its scenario (else validate warns)."""
    return lambda text: write(text, NAME)

PROVEN = GOOD.replace("  leaks:\n", "  leaks:\n  evidence: {}\n")


def _validate(path):
    r = runner.invoke(app, ["validate", str(path)])
    return r.exit_code, r.output


def test_a_fault_whose_default_is_reachable_gives_no_warning(write_as):
    code, out = _validate(write_as(PROVEN))
    assert code == 0 and "warning" not in out, out


def test_faults_without_the_evidence_check_are_warned_about(write_as):
    path = write_as(GOOD)
    code, out = _validate(path)
    assert code == 0
    assert f"warning: {path}:18: checks: the scenario has faults but no `evidence` check" in out


def test_latency_in_a_phase_that_sends_no_request_cannot_reach_its_default(write_as):
    path = write_as(PROVEN.replace("  - name: stall\n", "  - name: stall\n    requests: 0\n"))
    code, out = _validate(path)
    assert code == 0
    assert (f"warning: {path}:14: phases[1].faults[0]: fault 'latency-0' (latency): its default trigger (a request "
            "of the workload was in flight while the toxic was on the link") in out
    assert "cannot be reached: its phase sends no request; the run will be inconclusive" in out


def test_a_kill_no_later_request_meets_cannot_reach_its_default(write_as):
    text = PROVEN.replace("""      - kind: latency
        link: engine-lmcache
        latency_ms: 3000
""", """      - kind: kill
        service: lmcache
""").replace("  - name: stall\n", "  - name: stall\n    requests: 0\n")
    path = write_as(text)
    code, out = _validate(path)
    assert code == 0
    assert "fault 'kill-0' (kill): its default trigger" in out
    assert "neither its phase nor a later one sends a request" in out
    # A later phase with requests: reachable.
    later = text.replace("checks:\n", "  - name: recover\n    requests: 2\nchecks:\n")
    code, out = _validate(write_as(later))
    assert code == 0 and "warning" not in out, out


def test_trigger_none_is_warned_about_with_its_reason_and_line(write_as):
    text = PROVEN.replace("        duration: 1m30s\n",
                          "        duration: 1m30s\n        trigger: none\n        reason: only heartbeats\n")
    text = text.replace("  - name: warm\n", "  - name: warm\n    trigger: none\n    reason: nothing to prove\n")
    path = write_as(text)
    code, out = _validate(path)
    assert code == 0, out
    assert (f"warning: {path}:11: phases[0].trigger: phase 'warm' says `trigger: none` (nothing to prove): nothing "
            "proves its window; a run whose checks pass is 'passed (window not proven)', exit 5") in out
    assert f"warning: {path}:20: phases[1].faults[0].trigger: fault 'latency-0' (latency) says `trigger: none` " \
        "(only heartbeats)" in out


def test_trigger_none_needs_a_reason_and_reason_needs_trigger_none(write_as):
    path = write_as(PROVEN.replace("        duration: 1m30s\n", "        duration: 1m30s\n        trigger: none\n"))
    code, out = _validate(path)
    assert code == 2 and "`trigger: none` needs a `reason`" in out, out
    path = write_as(PROVEN.replace("        duration: 1m30s\n", "        duration: 1m30s\n        reason: why\n"))
    code, out = _validate(path)
    assert code == 2 and "`reason` is for `trigger: none`" in out, out
    path = write_as(PROVEN.replace("  - name: warm\n", "  - name: warm\n    trigger: none\n"))
    code, out = _validate(path)
    assert code == 2 and "`trigger: none` needs a `reason`" in out, out


def test_a_default_that_needs_what_the_stack_lacks_is_warned_about(write_as):
    """A delete on the filesystem L2 leaves no access time: only LMCache's /metrics can see a read."""
    text = PROVEN.replace("""      - kind: latency
        link: engine-lmcache
        latency_ms: 3000
""", """      - kind: l2_corrupt
        mode: delete
        target: fs
""")
    scenario = load_scenario(write_as(text))
    (warning,) = window_warnings(scenario, {"l2.fs"})
    assert warning[0] == ("phases", 1, "faults", 0)
    assert "its default trigger (a deleted L2 object was read" in warning[1]
    assert "needs lmcache.http, which the stack does not offer" in warning[1]
    assert window_warnings(scenario, {"l2.fs", "lmcache.http"}) == []
    # Both L2s: Redis' SLOWLOG shows a read of a deleted key too.
    both = load_scenario(write_as(text.replace("target: fs", "target: both")))
    assert window_warnings(both, {"l2.fs", "l2.redis"}) == []
    assert "needs lmcache.http|l2.redis" in window_warnings(both, {"l2.fs"})[0][1]


def _aimed_at_load_failure(fault_yaml: str) -> str:
    """PROVEN with its fault replaced by ``fault_yaml`` and a trigger on the engine's
    load-failure counter (the aim of a scenario for the engine's load-failure path), on the
    reference stack (which has the L2 tiers and the engine's counters)."""
    return PROVEN.replace("stack: stack.yml", f"stack: {REFERENCE}").replace("""      - kind: latency
        link: engine-lmcache
        latency_ms: 3000
        start: 500ms
        duration: 1m30s
""", fault_yaml + "        until: end\n        trigger: {metric: kvchaos_engine_load_failed_tokens_total, service: engine, grew_by: 256}\n")


def test_an_l2_fault_aimed_at_the_engine_load_failure_path_is_warned_about(write_as):
    """The input that showed it (issue 34): a scenario written for the engine's load-failure
    path with an L2 fault; in MP mode LMCache's prefetch trims the hit instead, so the planted
    `trust-failed-load` escaped it. validate says so at the fault's line, and names the faults
    that do reach the path; a retrieve_fail there gets no such warning."""
    path = write_as(_aimed_at_load_failure("      - kind: l2_corrupt\n        mode: delete\n        target: fs\n"))
    code, out = _validate(path)
    assert code == 0, out
    assert f"{path}:13: phases[1].faults[0]: fault 'l2_corrupt-0' (l2_corrupt) acts on L2 only" in out, out
    assert "the lookup's prefetch absorbs an L2 failure" in out and "retrieve_fail" in out
    path = write_as(_aimed_at_load_failure("      - kind: retrieve_fail\n        count: 2\n"))
    code, out = _validate(path)
    assert code == 0 and "acts on L2 only" not in out, out
    flush = "      - kind: tier_flush\n        tiers: [redis, fs]\n"
    assert any("acts on L2 only" in m for _p, m in window_warnings(load_scenario(write_as(
        _aimed_at_load_failure(flush)), check_paths=False)))
    # the same L2 fault without the aim: no warning (an L2 fault for the prefetch path is fine)
    plain = PROVEN.replace("stack: stack.yml", f"stack: {REFERENCE}").replace("""      - kind: latency
        link: engine-lmcache
        latency_ms: 3000
""", "      - kind: l2_corrupt\n        mode: delete\n        target: fs\n")
    assert not any("acts on L2 only" in m for _p, m in window_warnings(load_scenario(write_as(plain),
                                                                                      check_paths=False)))


def test_an_l1_flush_after_l2_fault_inject_is_warned_about(write_as):
    """Issue 34: l2_fault_inject's restarts of LMCache empty L1, which made a following
    tier_flush of L1 inconclusive with no word why; validate now says so at the flush's line."""
    text = PROVEN.replace("stack: stack.yml", f"stack: {REFERENCE}").replace("""      - kind: latency
        link: engine-lmcache
        latency_ms: 3000
        start: 500ms
        duration: 1m30s
""", """      - kind: l2_fault_inject
        adapters: [fs]
        gap_indices: [0]
        duration: 5s
      - kind: tier_flush
        tiers: [l1]
        start: 6s
        duration: 1s
""")
    path = write_as(text)
    code, out = _validate(path)
    assert code == 0, out
    line = text.splitlines().index("      - kind: tier_flush") + 1
    assert f"{path}:{line}: phases[1].faults[1]: fault 'tier_flush-1' (tier_flush of l1) comes after " \
           "l2_fault_inject 'l2_fault_inject-0'" in out, out
    code, out = _validate(write_as(text.replace("tiers: [l1]", "tiers: [redis]")))
    assert code == 0 and "comes after l2_fault_inject" not in out, out


def test_a_cancel_beside_a_slowed_lmcache_link_needs_the_engine_to_locate_its_aborts(write_as):
    """The held-back class of issue 34: clients cancel 300 ms after sending while a latency
    fault slows the LMCache link. Its window is an abort that lands in a pending lookup or load,
    which only the engine's request view can show: on a stack without it (vLLM) validate says
    the run will be inconclusive; on one with it, no warning."""
    text = PROVEN.replace("""        duration: 1m30s
""", """        duration: 1m30s
      - kind: cancel
        mode: after_ms
        after_ms: 300
        until: end
""")
    scenario = load_scenario(write_as(text))
    (warning,) = window_warnings(scenario, set())
    assert warning[0] == ("phases", 1, "faults", 1)
    assert ("its default trigger (an abort landed while the request's LMCache lookup or load was in flight, "
            "as the engine reports (a cancel beside latency") in warning[1]
    assert "needs engine.debug_state, which the stack does not offer: the run will be inconclusive" in warning[1]
    assert window_warnings(scenario, {"engine.debug_state"}) == []
