"""recompute_equivalence: every completed request produced the tokens the cache-off twin produces.

The oracle is the recompute twin (same model and seed, LMCache off, local prefix cache off):
the runner replays each request's prompt and cache_salt there and puts the token ids in
`snapshots.expected[request_id]`. Greedy decoding makes the output a function of the prompt,
so any difference means reused KV changed the computation (F1, F2, F3, F12 in the field
reports), whatever the hit rate says.

Verdicts:
- failed: some completed request's token ids differ from its expectation.
- unknown: no request completed, or some completed request has no expectation (the oracle
  could not vouch for it), and nothing differed.
- passed: every completed request matched.
A request that ended with finish_reason "abort" only has to be a prefix of its expectation.
"""

from __future__ import annotations

from typing import Any, Sequence

from chaos.checks.registry import coerce_config, register
from chaos.checks.requests import RequestRecord, requests
from chaos.checks.result import CheckResult
from chaos.checks.snapshots import Snapshots
from chaos.history import Op
from chaos.scenario.checks import RecomputeEquivalenceConfig

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


@register(NAME, RecomputeEquivalenceConfig)
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
    coerce_config(config, RecomputeEquivalenceConfig)
    done = [r for r in requests(history) if r.outcome == "ok"]
    mismatches: list[dict[str, Any]] = []
    missing: list[str] = []
    by_class: dict[str, list[int]] = {}
    matched = 0
    for rec in done:
        exp = snapshots.expected.get(rec.request_id)
        if exp is None or rec.token_ids is None:
            missing.append(rec.request_id)
            continue
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
