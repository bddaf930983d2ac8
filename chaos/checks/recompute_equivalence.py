"""recompute_equivalence: every completed request produced the tokens the cache-off twin produces.

The oracle is the recompute twin (same model and seed, LMCache off, local prefix cache off):
the runner replays each request's prompt and cache_salt there and puts the token ids in
`snapshots.expected[request_id]`. Greedy decoding makes the output a function of the prompt,
so any difference means reused KV changed the computation (F1, F2, F3, F12 in the field
reports), whatever the hit rate says.

Verdicts (``mode: exact``, the default):
- failed: some completed request's token ids differ from its expectation.
- unknown: no request completed, or some completed request has no expectation (the oracle
  could not vouch for it), and nothing differed.
- passed: every completed request matched.
A request that ended with finish_reason "abort" only has to be a prefix of its expectation.

``mode: tolerant``, for engines that are not bit-exact (vLLM without batch invariance: the same
prompt rounds differently in another batch, so greedy outputs flip where two tokens nearly
tie). Both sides are asked for top-2 logprobs. A divergence is *benign* only under the margin
rule of LMCache's own preemption correctness test (``Divergence.benign`` in
``.buildkite/k3_tests/multiprocess/scripts/preemption_correctness.py``): at the first differing
token the twin's top-1/top-2 logprob gap is at most ``margin_nats`` (0.1) and the engine
produced the twin's runner-up. LMCache's test takes the reference's ranking as the truth; on an
engine that is not batch-invariant the twin's ranking is one noisy sample too, so the rule is
also applied from the engine's side (its own top-1/top-2 gap at most ``margin_nats`` and the
twin's token its runner-up): a three-way near-tie ranked A>B>C by the twin and C>A>B by the
engine is benign, a token the engine is sure of and the twin is not (or the reverse) is not.
Anything else is *hard*. The noise floor is measured in the same
run: the twin asked every prompt again, one at a time (``snapshots.recompute_replay``).
- unknown: no request completed; the floor could not be measured; the twin diverges from
  itself with a hard divergence (the margin rule does not describe this engine's noise); a
  divergence cannot be classified (no twin logprobs); or an expectation is missing.
- failed: any hard divergence; or requests served from a cache (hit tokens > 0) diverge more
  often than the floor, by a one-sided Fisher exact test at level ``alpha`` (a bug whose damage
  happens to land on near-ties still raises the hit path's rate).
- passed: otherwise. The details give the floor's and the hit path's divergence rates.
"""

from __future__ import annotations

from math import comb
from typing import Any, Sequence

from chaos.checks.config import RecomputeEquivalenceConfig
from chaos.checks.registry import coerce_config, register
from chaos.checks.requests import RequestRecord, requests
from chaos.checks.result import CheckResult
from chaos.checks.snapshots import Snapshots
from chaos.history import Op

NAME = "recompute_equivalence"
WINDOW = 4  # tokens shown either side of the first difference


def first_difference(expected: list[int], actual: list[int]) -> int | None:
    """Index of the first position where the token lists differ (a length difference counts at
    the shorter length); None when they are equal."""
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e != a:
            return i
    if len(expected) != len(actual):
        return min(len(expected), len(actual))
    return None


def _describe(rec: RequestRecord) -> str:
    s = rec.cached_token_stats
    parts = [rec.request_class or "unclassified"]
    if s is not None:
        if s.external_cache_hit_tokens:
            parts.append(f"{s.external_cache_hit_tokens} tokens from LMCache")
        if s.local_cache_hit_tokens:
            parts.append(f"{s.local_cache_hit_tokens} tokens from local prefix cache")
        if s.load_failed_tokens:
            parts.append(f"{s.load_failed_tokens} tokens failed to load")
        if s.num_preemptions:
            parts.append(f"preempted {s.num_preemptions}x")
    return ", ".join(parts)


def mismatch_detail(rec: RequestRecord, expected: list[int], pos: int) -> dict[str, Any]:
    """Evidence for one differing request: position, token windows, class, cached_token_stats."""
    actual = rec.token_ids or []
    lo = max(0, pos - WINDOW)
    return {
        "request_id": rec.request_id,
        "phase": rec.phase,
        "tenant": rec.tenant,
        "request_class": rec.request_class,
        "cached_token_stats": rec.cached_token_stats.model_dump() if rec.cached_token_stats else None,
        "prompt_tokens": rec.prompt_tokens,
        "position": pos,
        "window_start": lo,
        "expected_window": expected[lo:pos + WINDOW + 1],
        "actual_window": actual[lo:pos + WINDOW + 1],
        "expected_len": len(expected),
        "actual_len": len(actual),
        "finish_reason": rec.finish_reason,
        "line": mismatch_line(rec, expected, pos),
    }


def mismatch_line(rec: RequestRecord, expected: list[int], pos: int) -> str:
    """One line such as `req w-17 (lmcache_hit_partial, 512 tokens from LMCache): token 0
    differs: expected 104, got 7`."""
    actual = rec.token_ids or []
    head = f"req {rec.request_id} ({_describe(rec)})"
    if pos < len(expected) and pos < len(actual):
        return f"{head}: token {pos} differs: expected {expected[pos]}, got {actual[pos]}"
    return f"{head}: output length differs: expected {len(expected)} tokens, got {len(actual)}"


def _paired(done: list[RequestRecord], snapshots: Snapshots) -> tuple[list[tuple[RequestRecord, list[int]]], list[str]]:
    """Completed requests with their expectation, and the ids of those without one (or
    without token ids)."""
    pairs, missing = [], []
    for rec in done:
        exp = snapshots.expected.get(rec.request_id)
        if exp is None or rec.token_ids is None:
            missing.append(rec.request_id)
        else:
            pairs.append((rec, exp))
    return pairs, missing


def _needs(cfg: RecomputeEquivalenceConfig) -> set[str]:
    return {"engine.logprobs"} if cfg.mode == "tolerant" else set()


@register(NAME, RecomputeEquivalenceConfig, needs=("recompute",), needs_for=_needs)
def check(history: Sequence[Op | dict[str, Any]], snapshots: Snapshots,
          config: RecomputeEquivalenceConfig | dict[str, Any] | None = None) -> CheckResult:
    """Compare each completed request's token ids with the recompute twin's.

    Args:
        history: the run's ops (dicts or `Op` models).
        snapshots: uses `expected` (request_id -> token ids).
        config: RecomputeEquivalenceConfig (no settings) or None.
    Returns:
        CheckResult; details: `checked`, `matched`, `no_expectation` (request ids),
        `mismatches` (list of dicts from `mismatch_detail`), `by_class` (class -> [checked,
        mismatched]).
    """
    cfg = coerce_config(config, RecomputeEquivalenceConfig)
    done = [r for r in requests(history) if r.outcome == "ok"]
    if cfg.mode == "tolerant":
        return _tolerant(done, snapshots, cfg)
    mismatches: list[dict[str, Any]] = []
    by_class: dict[str, list[int]] = {}
    matched = 0
    pairs, missing = _paired(done, snapshots)
    for rec, exp in pairs:
        counts = by_class.setdefault(rec.request_class or "unclassified", [0, 0])
        counts[0] += 1
        actual = rec.token_ids
        if rec.finish_reason == "abort" and actual == exp[:len(actual)]:
            pos = None
        else:
            pos = first_difference(exp, actual)
        if pos is None:
            matched += 1
            continue
        counts[1] += 1
        mismatches.append(mismatch_detail(rec, exp, pos))
    details = {"checked": matched + len(mismatches), "matched": matched,
               "no_expectation": missing, "mismatches": mismatches, "by_class": by_class}
    if mismatches:
        more = f" (and {len(mismatches) - 1} more of {len(done)} completed)" if len(mismatches) > 1 else ""
        return CheckResult(name=NAME, verdict="failed", summary=mismatches[0]["line"] + more, details=details)
    if not done:
        return CheckResult(name=NAME, verdict="unknown",
                           summary="no request completed: nothing to compare with recompute",
                           details=details)
    if missing:
        return CheckResult(
            name=NAME, verdict="unknown",
            summary=(f"{len(missing)} of {len(done)} completed requests have no recompute "
                     f"expectation or no token ids (first: {missing[0]}); the other {matched} matched"),
            details=details)
    return CheckResult(name=NAME, verdict="passed",
                       summary=f"all {matched} completed requests equal their recompute output",
                       details=details)


# --- tolerant mode ---------------------------------------------------------------------------

def _near_tie(alts: list | None, other_token: int, margin_nats: float) -> tuple[float | None, bool | None]:
    """(top-1/top-2 gap, whether ``other_token`` is the runner-up) of one side's top-2 at a
    position; (None, None) when that side's logprobs are missing."""
    if not alts or len(alts) < 2:
        return None, None
    (_t1, lp1), (t2, lp2) = alts[0][:2], alts[1][:2]
    return float(lp1) - float(lp2), int(t2) == other_token


def divergence(expected: list[int], actual: list[int], top: list | None, *, aborted: bool,
               margin_nats: float, actual_top: list | None = None) -> dict[str, Any] | None:
    """Classify how ``actual`` departs from ``expected`` (None: it does not).

    Args:
        expected: the twin's token ids.
        actual: the engine's token ids.
        top: the twin's top-2 per expected token, ``[[id, logprob], [id, logprob]]`` (None:
            not available).
        aborted: the request was aborted (``actual`` need only be a prefix).
        margin_nats: the margin rule's largest benign top-1/top-2 gap.
        actual_top: the engine's own top-2 per generated token (None: not available); the
            rule is applied from its side too.

    Returns:
        ``{"position", "expected_token", "actual_token", "gap", "runner_up", "engine_gap",
        "engine_runner_up", "benign"}`` (``gap``/``runner_up``: the twin's view); ``benign`` is
        None when neither side's logprobs at that position are there and the twin's are
        missing, False for a length difference or a token that breaks the margin rule from
        both sides.
    """
    if aborted and actual == expected[:len(actual)]:
        return None
    pos = first_difference(expected, actual)
    if pos is None:
        return None
    out: dict[str, Any] = {"position": pos, "expected_token": expected[pos] if pos < len(expected) else None,
                           "actual_token": actual[pos] if pos < len(actual) else None,
                           "gap": None, "runner_up": None, "engine_gap": None, "engine_runner_up": None,
                           "benign": False}
    if out["expected_token"] is None or out["actual_token"] is None:
        return out  # a length difference is never numerical noise
    out["gap"], out["runner_up"] = _near_tie(top[pos] if top is not None and pos < len(top) else None,
                                             out["actual_token"], margin_nats)
    out["engine_gap"], out["engine_runner_up"] = _near_tie(
        actual_top[pos] if actual_top is not None and pos < len(actual_top) else None,
        out["expected_token"], margin_nats)
    if out["gap"] is None:
        out["benign"] = None  # the twin's view is the rule's; without it nothing is decided
        return out
    twin_view = bool(out["runner_up"] and out["gap"] <= margin_nats)
    engine_view = bool(out["engine_runner_up"] and out["engine_gap"] is not None and out["engine_gap"] <= margin_nats)
    out["benign"] = twin_view or engine_view
    return out


def fisher_greater(hits_diverged: int, hits: int, floor_diverged: int, floor: int) -> float:
    """One-sided Fisher exact test: P(at least ``hits_diverged`` of the ``hits`` requests
    diverge) when hits and floor replays share one divergence rate (hypergeometric tail).

    Returns:
        The p-value, 0..1 (1.0 when either sample is empty).
    """
    if hits <= 0 or floor <= 0:
        return 1.0
    n, k = hits + floor, hits_diverged + floor_diverged
    total = comb(n, hits)
    tail = sum(comb(k, x) * comb(n - k, hits - x) for x in range(hits_diverged, min(k, hits) + 1))
    return tail / total


def _rate(part: int, whole: int) -> str:
    return f"{part}/{whole}" + (f" ({part / whole:.0%})" if whole else "")


def _tolerant(done: list[RequestRecord], snapshots: Snapshots, cfg: RecomputeEquivalenceConfig) -> CheckResult:
    margin = cfg.margin_nats
    benign: list[dict[str, Any]] = []
    hard: list[dict[str, Any]] = []
    unclassified: list[dict[str, Any]] = []
    path = {"hit": [0, 0], "miss": [0, 0]}  # [requests, diverged]
    matched = 0
    pairs, missing = _paired(done, snapshots)
    for rec, exp in pairs:
        d = divergence(exp, rec.token_ids, snapshots.expected_top_logprobs.get(rec.request_id),
                       aborted=rec.finish_reason == "abort", margin_nats=margin,
                       actual_top=rec.end_value.get("top_logprobs"))
        counts = path["hit" if rec.hit_tokens > 0 else "miss"]
        counts[0] += 1
        if d is None:
            matched += 1
            continue
        counts[1] += 1
        detail = {**mismatch_detail(rec, exp, d["position"]), **d}
        (benign if d["benign"] else hard if d["benign"] is False else unclassified).append(detail)
    floor = {"replayed": 0, "diverged": 0, "benign": 0, "hard": [], "unclassified": 0}
    for rid, rep in snapshots.recompute_replay.items():
        exp = snapshots.expected.get(rid)
        if exp is None:
            continue
        floor["replayed"] += 1
        d = divergence(exp, rep, snapshots.expected_top_logprobs.get(rid), aborted=False, margin_nats=margin,
                       actual_top=snapshots.recompute_replay_top_logprobs.get(rid))
        if d is None:
            continue
        floor["diverged"] += 1
        if d["benign"]:
            floor["benign"] += 1
        elif d["benign"] is False:
            floor["hard"].append({"request_id": rid, **d})
        else:
            floor["unclassified"] += 1
    hits, hit_div = path["hit"]
    p_value = fisher_greater(hit_div, hits, floor["diverged"], floor["replayed"])
    details: dict[str, Any] = {
        "mode": "tolerant", "margin_nats": margin, "alpha": cfg.alpha,
        "checked": matched + len(benign) + len(hard) + len(unclassified), "matched": matched,
        "no_expectation": missing, "benign": benign, "mismatches": hard, "unclassified": unclassified,
        "noise_floor": {**floor, "rate": floor["diverged"] / floor["replayed"] if floor["replayed"] else None,
                        "error": snapshots.recompute_replay_error},
        "hit_path": {"requests": hits, "diverged": hit_div, "rate": hit_div / hits if hits else None},
        "miss_path": {"requests": path["miss"][0], "diverged": path["miss"][1],
                      "rate": path["miss"][1] / path["miss"][0] if path["miss"][0] else None},
        "p_value": p_value,
    }
    rates = (f"hit-path divergence {_rate(hit_div, hits)} vs noise floor "
             f"{_rate(floor['diverged'], floor['replayed'])}")

    def result(verdict: str, summary: str) -> CheckResult:
        return CheckResult(name=NAME, verdict=verdict, summary=summary, details=details)

    def hard_line(x: dict[str, Any]) -> str:
        if x["gap"] is None:
            return x["line"]
        why = "not the twin's runner-up" if not x["runner_up"] else f"gap {x['gap']:.3f} > {margin:g} nats"
        eng = "" if x["engine_gap"] is None else (
            f"; engine's own gap {x['engine_gap']:.3f} nats, the twin's token "
            + ("its runner-up" if x["engine_runner_up"] else "not its runner-up"))
        return f"{x['line']} (twin's top-1/top-2 gap {x['gap']:.3f} nats; {why}{eng})"

    if not done:
        return result("unknown", "no request completed: nothing to compare with recompute")
    if floor["hard"]:
        x = floor["hard"][0]
        return result("unknown", (
            f"the recompute twin diverges from itself beyond the margin rule ({len(floor['hard'])} of "
            f"{floor['replayed']} replays; first: req {x['request_id']} token {x['position']}, gap "
            f"{x['gap'] if x['gap'] is None else round(x['gap'], 3)}): its noise is not near-tie noise, "
            "so no divergence can be judged; raise margin_nats or make the engine batch-invariant"))
    if not floor["replayed"]:
        why = snapshots.recompute_replay_error or "the twin was not asked again"
        return result("unknown", f"no noise floor measured ({why}); {len(hard)} hard and {len(benign)} "
                                 "benign divergences cannot be judged against it")
    if hard:
        more = f" (and {len(hard) - 1} more hard divergences)" if len(hard) > 1 else ""
        return result("failed", hard_line(hard[0]) + more + f"; {rates}")
    if unclassified:
        return result("unknown", f"{len(unclassified)} divergences cannot be classified: the twin's "
                                 f"top-2 logprobs are missing (first: req {unclassified[0]['request_id']})")
    if p_value < cfg.alpha:
        return result("failed", f"cache hits diverge from recompute more often than the twin from itself: "
                                f"{rates}, p={p_value:.2g} < {cfg.alpha:g} (every divergence at a near-tie)")
    if missing:
        return result("unknown", f"{len(missing)} of {len(done)} completed requests have no recompute "
                                 f"expectation or no token ids (first: {missing[0]}); {rates}")
    return result("passed", f"all {len(done)} completed requests equal recompute or differ at a near-tie "
                            f"({len(benign)} benign, gap <= {margin:g} nats); {rates}")

