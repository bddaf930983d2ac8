"""recompute_equivalence, mode tolerant: the margin rule, the noise floor, and the rate test.

The rule is LMCache's own (preemption_correctness.py ``Divergence.benign``): at the first
differing token the twin's top-1/top-2 logprob gap is at most 0.1 nats and the engine produced
the twin's runner-up.
"""

from __future__ import annotations

from chaos.checks import Snapshots, recompute_equivalence
from chaos.checks.config import RecomputeEquivalenceConfig
from chaos.checks.recompute_equivalence import divergence, fisher_greater

PROMPT = list(range(300))
TOLERANT = {"mode": "tolerant"}


def top(*rows: tuple[int, float, int, float]) -> list:
    """The twin's top-2 per token from (top-1 id, logprob, top-2 id, logprob) rows."""
    return [[[a, la], [b, lb]] for a, la, b, lb in rows]


EXP = [5, 6, 7]
EXP_TOP = top((5, -0.70, 9, -0.72), (6, -0.1, 3, -2.0), (7, -0.2, 1, -1.9))  # token 0 nearly ties


def test_divergence_rule():
    assert divergence(EXP, [5, 6, 7], EXP_TOP, aborted=False, margin_nats=0.1) is None
    near = divergence(EXP, [9, 1, 1], EXP_TOP, aborted=False, margin_nats=0.1)
    assert near["benign"] and near["runner_up"] and abs(near["gap"] - 0.02) < 1e-9
    not_runner_up = divergence(EXP, [4, 1, 1], EXP_TOP, aborted=False, margin_nats=0.1)
    assert not_runner_up["benign"] is False and not not_runner_up["runner_up"]
    wide_gap = divergence(EXP, [5, 3, 1], EXP_TOP, aborted=False, margin_nats=0.1)
    assert wide_gap["benign"] is False and wide_gap["runner_up"] and wide_gap["gap"] > 1.8
    assert divergence(EXP, [5, 3, 1], EXP_TOP, aborted=False, margin_nats=2.0)["benign"]
    assert divergence(EXP, [5, 6], EXP_TOP, aborted=False, margin_nats=0.1)["benign"] is False  # length
    assert divergence(EXP, [5, 6], EXP_TOP, aborted=True, margin_nats=0.1) is None
    assert divergence(EXP, [9, 6, 7], None, aborted=False, margin_nats=0.1)["benign"] is None


def test_fisher_greater():
    assert fisher_greater(0, 10, 0, 10) == 1.0
    assert fisher_greater(10, 10, 0, 10) < 1e-5
    assert 0.4 < fisher_greater(1, 10, 1, 10) < 0.8
    assert fisher_greater(3, 10, 0, 0) == 1.0


def _snaps(hb, n_hits: int, hit_outputs, floor_outputs) -> Snapshots:
    expected, tops, replay = {}, {}, {}
    for i in range(n_hits):
        rid = f"h-{i}"
        hb.request(rid, PROMPT, hit_outputs(i), external=256, t0=i, t1=i + 0.5)
        expected[rid], tops[rid], replay[rid] = EXP, EXP_TOP, floor_outputs(i)
    return Snapshots(expected=expected, expected_top_logprobs=tops, recompute_replay=replay,
                     recompute_replay_top_logprobs=tops)


def test_benign_noise_at_the_floors_rate_passes_and_reports_both_rates(hb):
    near_tie = lambda i: [9, 1, 1] if i % 4 == 0 else EXP  # noqa: E731 - 25% near-tie flips
    snaps = _snaps(hb, 12, near_tie, near_tie)
    r = recompute_equivalence.check(hb.ops, snaps, TOLERANT)
    assert r.verdict == "passed", r.summary
    assert r.details["hit_path"] == {"requests": 12, "diverged": 3, "rate": 0.25}
    assert r.details["noise_floor"]["rate"] == 0.25 and len(r.details["benign"]) == 3
    assert "hit-path divergence 3/12 (25%) vs noise floor 3/12 (25%)" in r.summary
    # The same history in exact mode fails: the tolerant mode is what lets it pass.
    assert recompute_equivalence.check(hb.ops, snaps, {}).verdict == "failed"


def test_hard_divergence_fails_with_gap_and_reason(hb):
    snaps = _snaps(hb, 6, lambda i: [4, 1, 1] if i == 2 else EXP, lambda i: EXP)
    r = recompute_equivalence.check(hb.ops, snaps, TOLERANT)
    assert r.verdict == "failed"
    assert "req h-2" in r.summary and "not the twin's runner-up" in r.summary and "gap 0.020" in r.summary


def test_near_ties_on_hits_far_above_the_floor_fail(hb):
    """A bug whose damage lands on near-ties still raises the hit path's divergence rate."""
    snaps = _snaps(hb, 40, lambda i: [9, 1, 1], lambda i: [9, 1, 1] if i == 0 else EXP)
    r = recompute_equivalence.check(hb.ops, snaps, RecomputeEquivalenceConfig(mode="tolerant"))
    assert r.verdict == "failed", r.summary
    assert r.details["p_value"] < 0.001 and "more often than the twin from itself" in r.summary


def test_twin_breaking_the_margin_rule_against_itself_is_unknown(hb):
    snaps = _snaps(hb, 6, lambda i: [4, 1, 1], lambda i: [4, 1, 1] if i == 0 else EXP)
    r = recompute_equivalence.check(hb.ops, snaps, TOLERANT)
    assert r.verdict == "unknown" and "diverges from itself beyond the margin rule" in r.summary


def test_no_floor_is_unknown_not_a_verdict(hb):
    snaps = _snaps(hb, 4, lambda i: [4, 1, 1], lambda i: EXP)
    snaps.recompute_replay = {}
    snaps.recompute_replay_error = "recompute twin failed request x"
    r = recompute_equivalence.check(hb.ops, snaps, TOLERANT)
    assert r.verdict == "unknown" and "no noise floor measured (recompute twin failed" in r.summary


def test_missing_twin_logprobs_is_unknown(hb):
    snaps = _snaps(hb, 4, lambda i: [9, 1, 1] if i == 0 else EXP, lambda i: EXP)
    snaps.expected_top_logprobs.pop("h-0")
    r = recompute_equivalence.check(hb.ops, snaps, TOLERANT)
    assert r.verdict == "unknown" and "cannot be classified" in r.summary


def test_tolerant_mode_needs_logprobs():
    from chaos.checks.registry import get

    spec = get("recompute_equivalence")
    assert spec.capability_needs(None) == {"recompute"}
    assert spec.capability_needs({"mode": "tolerant"}) == {"recompute", "engine.logprobs"}


def test_the_rule_from_the_engines_side_too():
    """A three-way near-tie: the twin ranks 5 > 9 > 4, the engine 4 > 5 (gap 0.01): the
    engine's token is not the twin's runner-up, yet the twin's token is the engine's runner-up
    within the margin, so the flip is noise. A confident engine token is not."""
    engine_unsure = [[[4, -0.69], [5, -0.70]], [[1, -0.1], [2, -3.0]], [[1, -0.1], [2, -3.0]]]
    d = divergence(EXP, [4, 1, 1], EXP_TOP, aborted=False, margin_nats=0.1, actual_top=engine_unsure)
    assert d["benign"] and not d["runner_up"] and d["engine_runner_up"] and abs(d["engine_gap"] - 0.01) < 1e-9
    engine_sure = [[[4, -0.01], [5, -3.0]], [[1, -0.1], [2, -3.0]], [[1, -0.1], [2, -3.0]]]
    assert divergence(EXP, [4, 1, 1], EXP_TOP, aborted=False, margin_nats=0.1,
                      actual_top=engine_sure)["benign"] is False
