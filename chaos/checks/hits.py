"""Hit accounting shared by the hit_quality check, the SLO check and the run statistics.

One place defines what a "hit" is, so that a check and the report's stats table never disagree:

    RequestRecord (requests.py) ──> RequestHits: what LMCache served this request, what the engine's
                                    own prefix cache served, what was looked up, whether the
                                    request re-sent a prefix stored earlier, and whether its output
                                    equals recompute
                          └──────> HitSummary of a set of requests: rates, each with its numerator
                                    and denominator

Definitions (/work/shared/corpus/false-hit-triage.md, "What production needs measured"):

- LMCache token hit rate = sum(external_cache_hit_tokens) / sum(prompt tokens looked up), over
  completed requests whose engine sent a lookup to LMCache (``cached_token_stats.lookup`` not
  ``disabled``). Tokens the engine's own prefix cache served (``local_cache_hit_tokens``) are
  never added in: they have their own local token hit rate (over all completed requests).
- request hit rate, *any-hit*: completed requests with at least one token from LMCache /
  completed requests looked up. *Full-hit*: those whose prompt was served without computing
  anything but the last prompt token (LMCache + local >= prompt_len - 1; an engine always
  computes the last prompt token), with at least one token from LMCache (request class
  ``lmcache_hit_full``).
- a *stored prefix*: the full chunks (``chunk_size`` tokens each) of the prompt of a request that
  completed earlier; an engine stores only full prompt chunks. A later request of the same tenant
  re-sends ``stored_prefix_tokens`` of it: the longest common prefix with any such prompt, cut to
  whole chunks, capped at the whole chunks before its own last prompt token (never loaded). A
  *full hit of a re-sent stored prefix*: no stored token recomputed (LMCache + local hit tokens
  >= stored_prefix_tokens).
- correct-hit rate = LMCache-hit requests whose output equals the recompute twin's / LMCache-hit
  requests with a recompute expectation. A 98% hit rate with wrong output is the failure this
  project exists for, so the two are always shown side by side.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pydantic import BaseModel

from chaos.checks.requests import RequestRecord

__all__ = ["RequestHits", "HitSummary", "request_hits", "summarize", "output_matches", "common_chunk_tokens",
           "DEFINITIONS"]

DEFINITIONS: dict[str, str] = {
    "token_hit_rate": "LMCache token hit rate: sum(external_cache_hit_tokens) / sum(prompt tokens looked up in "
                      "LMCache), completed requests; the engine's own prefix cache is never added in",
    "local_token_hit_rate": "sum(local_cache_hit_tokens) / sum(prompt tokens), completed requests: the "
                            "engine's own prefix cache, on its own",
    "request_hit_rate": "any-hit: completed requests with >= 1 token from LMCache / completed requests looked up",
    "full_hit_rate": "full-hit: completed requests served all but the last prompt token (LMCache + local), "
                     "with >= 1 token from LMCache / completed requests looked up",
    "correct_hit_rate": "LMCache-hit requests whose output equals the recompute twin's / LMCache-hit requests "
                        "with a recompute expectation",
    "stored_prefix_full_hit_rate": "requests re-sending a prefix stored earlier (full chunks of an earlier "
                                   "completed prompt, same tenant) that recomputed none of it / such requests",
}


def common_chunk_tokens(a: list[int], b: list[int], chunk_size: int, limit: int) -> int:
    """Tokens of the whole chunks two token lists share from the start, at most ``limit``.

    Compares a chunk at a time (list slices compare in C), so a long workload stays cheap.
    """
    n = (min(len(a), len(b), limit) // chunk_size) * chunk_size
    i = 0
    while i < n and a[i:i + chunk_size] == b[i:i + chunk_size]:
        i += chunk_size
    return i


class RequestHits(BaseModel):
    """What the cache did for one completed request (tokens; None: not known).

    Attributes:
        request_id, phase, tenant, request_class: from the record.
        prompt_tokens: prompt length.
        looked_up: the engine sent an LMCache lookup (``lookup`` not ``disabled``); None when the
            engine reported no cached_token_stats.
        lmcache_tokens / local_tokens: tokens served by LMCache / by the engine's prefix cache.
        full_hit: request class ``lmcache_hit_full``.
        stored_prefix_tokens: tokens of this prompt stored earlier as full chunks (0: none).
        stored_prefix_source: the request whose stored prompt gives stored_prefix_tokens.
        recomputed_stored_tokens: stored prefix tokens neither cache served (> 0: a miss of a
            stored chunk).
        output_matches: output equals the recompute expectation; None without an expectation.
    """

    request_id: str
    phase: str
    tenant: str | None = None
    request_class: str | None = None
    prompt_tokens: int = 0
    looked_up: bool | None = None
    lmcache_tokens: int = 0
    local_tokens: int = 0
    full_hit: bool = False
    stored_prefix_tokens: int = 0
    stored_prefix_source: str | None = None
    recomputed_stored_tokens: int = 0
    output_matches: bool | None = None

    @property
    def lmcache_hit(self) -> bool:
        """At least one prompt token came from LMCache."""
        return self.lmcache_tokens > 0


def output_matches(records: Iterable[RequestRecord], expected: Mapping[str, list[int]]) -> dict[str, bool]:
    """request id -> output equals the recompute expectation, for completed requests that have one
    (the rule of recompute_equivalence: an aborted output only has to be a prefix)."""
    out: dict[str, bool] = {}
    for rec in records:
        exp = expected.get(rec.request_id)
        if rec.outcome != "ok" or exp is None or rec.token_ids is None:
            continue
        if rec.finish_reason == "abort":
            out[rec.request_id] = rec.token_ids == exp[:len(rec.token_ids)]
        else:
            out[rec.request_id] = rec.token_ids == exp
    return out


def request_hits(records: Iterable[RequestRecord], *, chunk_size: int = 256,
                 matches: Mapping[str, bool] | None = None,
                 stored_from: Iterable[RequestRecord] | None = None) -> list[RequestHits]:
    """Hit facts of each completed (``ok``) request of ``records``.

    Args:
        records: paired requests (chaos.checks.requests.requests), any phases.
        chunk_size: LMCache chunk size in tokens (snapshots.chunk_size).
        matches: request id -> output equals recompute (:func:`output_matches`); None: not
            measured (every ``output_matches`` is None).
        stored_from: the requests whose prompts count as stored (default: ``records``); a prompt
            counts for a request only when it completed (``ok``) before that request was invoked,
            with the same tenant (cache_salt).
    Returns:
        one RequestHits per completed request, in invoke order.
    Raises:
        ValueError: chunk_size < 1.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    recs = list(records)
    stored = [r for r in (recs if stored_from is None else list(stored_from))
              if r.outcome == "ok" and r.prompt_token_ids and r.end_time is not None]
    stored.sort(key=lambda r: r.end_time or 0.0)
    out: list[RequestHits] = []
    for rec in recs:
        if rec.outcome != "ok":
            continue
        s = rec.cached_token_stats
        prompt = rec.prompt_token_ids or []
        n = rec.prompt_tokens or len(prompt)
        h = RequestHits(request_id=rec.request_id, phase=rec.phase, tenant=rec.tenant,
                        request_class=rec.request_class, prompt_tokens=n,
                        looked_up=None if s is None else (s.lookup or "miss") != "disabled",
                        lmcache_tokens=s.external_cache_hit_tokens if s else 0,
                        local_tokens=s.local_cache_hit_tokens if s else 0,
                        full_hit=rec.request_class == "lmcache_hit_full",
                        output_matches=None if matches is None else matches.get(rec.request_id))
        if prompt:
            # The engine never loads the last prompt token: whole chunks before it at most.
            cap = ((len(prompt) - 1) // chunk_size) * chunk_size
            best, source = 0, None
            for prev in stored:
                if (prev.end_time or 0.0) >= rec.invoke_time:
                    break
                if prev.request_id == rec.request_id or prev.tenant != rec.tenant:
                    continue
                prev_prompt = prev.prompt_token_ids or []
                tokens = common_chunk_tokens(prompt, prev_prompt, chunk_size, cap)
                if tokens > best:
                    best, source = tokens, prev.request_id
            h.stored_prefix_tokens, h.stored_prefix_source = best, source
            h.recomputed_stored_tokens = max(0, best - h.lmcache_tokens - h.local_tokens)
        out.append(h)
    return out


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


class HitSummary(BaseModel):
    """Hit rates of a set of completed requests, each with its numerator and denominator.

    Rates are None when their denominator is 0. See the module docstring for the definitions.
    """

    completed: int = 0
    without_stats: int = 0
    looked_up: int = 0
    prompt_tokens: int = 0
    looked_up_tokens: int = 0
    lmcache_tokens: int = 0
    local_tokens: int = 0
    token_hit_rate: float | None = None
    local_token_hit_rate: float | None = None
    lmcache_hits: int = 0
    full_hits: int = 0
    request_hit_rate: float | None = None
    full_hit_rate: float | None = None
    hits_checked: int = 0
    correct_hits: int = 0
    correct_hit_rate: float | None = None
    stored_prefix_requests: int = 0
    stored_prefix_full_hits: int = 0
    stored_prefix_full_hit_rate: float | None = None


def summarize(hits: Iterable[RequestHits]) -> HitSummary:
    """Rates over ``hits`` (chaos.checks.hits.request_hits output)."""
    hs = list(hits)
    s = HitSummary(completed=len(hs))
    for h in hs:
        s.prompt_tokens += h.prompt_tokens
        s.local_tokens += h.local_tokens
        if h.looked_up is None:
            s.without_stats += 1
            continue
        if not h.looked_up:
            continue
        s.looked_up += 1
        s.looked_up_tokens += h.prompt_tokens
        s.lmcache_tokens += h.lmcache_tokens
        s.lmcache_hits += h.lmcache_hit
        s.full_hits += h.full_hit
        if h.lmcache_hit and h.output_matches is not None:
            s.hits_checked += 1
            s.correct_hits += h.output_matches
        if h.stored_prefix_tokens > 0:
            s.stored_prefix_requests += 1
            s.stored_prefix_full_hits += h.recomputed_stored_tokens == 0
    s.token_hit_rate = _rate(s.lmcache_tokens, s.looked_up_tokens)
    with_stats = [h for h in hs if h.looked_up is not None]
    s.local_token_hit_rate = _rate(sum(h.local_tokens for h in with_stats), sum(h.prompt_tokens for h in with_stats))
    s.request_hit_rate = _rate(s.lmcache_hits, s.looked_up)
    s.full_hit_rate = _rate(s.full_hits, s.looked_up)
    s.correct_hit_rate = _rate(s.correct_hits, s.hits_checked)
    s.stored_prefix_full_hit_rate = _rate(s.stored_prefix_full_hits, s.stored_prefix_requests)
    return s
