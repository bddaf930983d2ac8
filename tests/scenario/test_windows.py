"""`kvchaos validate` warns about every fault and phase whose window nothing proves (issue 34):
a `trigger: none`, a default trigger the phase's requests cannot reach, one that needs what the
stack lacks; `trigger: none` needs a `reason`."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from chaos.scenario.cli import app
from chaos.scenario.loader import load_scenario
from chaos.scenario.windows import window_warnings

from .samples import GOOD

runner = CliRunner()
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
