"""xfail limited to stacks (``xfail.stacks``) and to checks (``xfail.checks``): a known bug of
one engine is XFAIL there and must pass elsewhere; a failure beyond the known bug's checks is
FAILED (exit 1), never hidden as XFAIL."""

from __future__ import annotations

from pathlib import Path

from chaos.checks import CheckResult
from chaos.report.result import build_result
from chaos.runner.suite import load_and_validate
from chaos.scenario.model import Xfail

REPO = Path(__file__).resolve().parents[2]
LOOKUP_TIMEOUT = REPO / "scenarios/lookup-timeout.yaml"


def test_xfail_with_stacks_applies_only_on_those_stacks():
    vllm = load_and_validate([LOOKUP_TIMEOUT], REPO / "compose/vllm-cpu.yml")[0]
    reference = load_and_validate([LOOKUP_TIMEOUT])[0]
    assert vllm.xfail is not None and vllm.xfail.stacks == ["vllm-cpu"] and vllm.xfail.checks == ["leaks"]
    assert vllm.expected_failure is vllm.xfail
    assert reference.expected_failure is None  # passes on the reference engine: no XFAIL there
    reference.xfail = Xfail(reason="every stack")
    assert reference.expected_failure is reference.xfail


def _result(verdicts: dict[str, str], xfail: Xfail):
    checks = [CheckResult(name=n, verdict=v, summary=f"{n} said {v}") for n, v in verdicts.items()]
    return build_result(run_id="r", scenario="s", history=[], checks=checks, seed=1, xfail=xfail)


def test_xfail_with_checks_is_xfail_only_when_just_those_fail():
    xf = Xfail(reason="leak on vLLM", stacks=["vllm-cpu"], checks=["leaks"])
    known = _result({"leaks": "failed", "liveness": "passed"}, xf)
    assert known.verdict == "failed" and known.xfail.outcome == "xfailed" and known.exit_code == 0
    beyond = _result({"leaks": "failed", "recompute_equivalence": "failed"}, xf)
    assert beyond.xfail.outcome is None and beyond.xfail.unexpected == ["recompute_equivalence"]
    assert beyond.exit_code == 1
    fixed = _result({"leaks": "passed"}, xf)
    assert fixed.xfail.outcome == "xpassed" and fixed.exit_code == 0
    anything = _result({"liveness": "failed"}, Xfail(reason="any check"))
    assert anything.xfail.outcome == "xfailed" and anything.exit_code == 0
