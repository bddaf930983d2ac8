"""What the runner times on the recompute twin for the host-load rule (chaos/runner/baseline.py)."""

from chaos.checks.requests import RequestRecord
from chaos.runner.baseline import MAX_WAVES, _plan, measure_twin


def rec(rid: str, prompt: list[int], latency: float, phase: str = "warm", outcome: str = "ok") -> RequestRecord:
    return RequestRecord(request_id=rid, phase=phase, invoke_time=0.0, end_time=latency, outcome=outcome,
                         prompt_token_ids=prompt, invoke_value={"max_tokens": 4, "stream": False})


def test_plan_fills_the_concurrency_with_distinct_prompts_of_the_same_phase():
    late = rec("w-late", [1, 2], 31.0, outcome="info")
    everyone = [late, rec("w-1", [3], 20.0), rec("w-2", [3], 21.0), rec("x-1", [4], 2.0, phase="other"),
                rec("w-3", [5], 22.0), rec("w-4", [6], 23.0)]
    assert [r.request_id for r in _plan([late], everyone, 4)] == ["w-late", "w-1", "w-3", "w-4"]


def test_plan_times_the_slowest_first_and_at_most_two_waves():
    slow = [rec(f"w-{i}", [i], 30.0 + i, outcome="info") for i in range(10)]
    plan = _plan(slow, slow, 2)
    assert len(plan) == MAX_WAVES * 2 and [r.request_id for r in plan] == ["w-9", "w-8", "w-7", "w-6"]


def test_a_stack_without_twin_gives_a_baseline_that_says_so():
    base = measure_twin(None, [rec("w-late", [1], 31.0, outcome="info")], [], concurrency=4,
                        run_async=lambda _c: None)
    assert base.timings == {} and "no recompute twin" in base.error and base.slow == ["w-late"]
