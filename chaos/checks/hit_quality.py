"""hit_quality: how much LMCache served, phase by phase, and whether what it served was right.

``hit_recovery`` asks for one LMCache token per request; a scenario that claims "the re-sent
prefix hits in full" needs more. For each phase in ``phases`` this check measures (definitions in
chaos/checks/hits.py):

    LMCache token hit rate   >= min_token_hit_rate     (LMCache tokens / prompt tokens looked up;
                                                         the engine's prefix cache is not added in)
    request hit rate, any    >= min_request_hit_rate
    request hit rate, full   >= min_full_hit_rate
    stored prefix full hit   (stored_prefix_full_hit: every request re-sending the full chunks of
                              an earlier completed prompt recomputes none of them)
    correct-hit rate         >= min_correct_hit_rate   (hits whose output equals recompute; always
                                                         reported next to the hit rate)

Verdicts: failed when a phase with enough requests misses a bound; unknown when a phase has fewer
than ``min_requests`` completed requests looked up in LMCache, when the engine reported no
cached_token_stats, when ``stored_prefix_full_hit`` is asked and no request of the phase re-sent
a stored prefix (the case never happened), or when ``min_correct_hit_rate`` is set and no hit has
a recompute expectation; passed otherwise. Failed wins over unknown across phases.

Needs the engine's per-request cache accounting (``engine.cache_stats``), and the recompute twin
when ``min_correct_hit_rate`` is set: a scenario whose stack lacks them is rejected at validation
(chaos/checks/registry.py) instead of starting a stack whose every phase can only be unknown.
"""

from __future__ import annotations

from typing import Any, Sequence

from chaos.checks.config import HitQualityConfig
from chaos.checks.hits import RequestHits, output_matches, request_hits, summarize
from chaos.checks.registry import coerce_config, register
from chaos.checks.requests import requests
from chaos.checks.result import CheckResult, Verdict, worst
from chaos.checks.snapshots import Snapshots
from chaos.history import Op

NAME = "hit_quality"
SHOWN = 10  # offending request ids listed per phase


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"


def _judge_phase(phase: str, hits: list[RequestHits],
                 cfg: HitQualityConfig) -> tuple[Verdict, list[str], list[str], dict[str, Any]]:
    s = summarize(hits)
    d: dict[str, Any] = s.model_dump()
    problems: list[str] = []
    unknowns: list[str] = []
    if s.looked_up < cfg.min_requests:
        why = (f"{s.without_stats} completed without cached_token_stats" if s.without_stats
               else f"{s.looked_up} completed request(s) looked up in LMCache")
        unknowns.append(f"{phase}: too few samples ({why}; at least {cfg.min_requests} needed)")
        d["verdict"] = "unknown"
        return "unknown", problems, unknowns, d
    for label, rate, bound in (("LMCache token hit rate", s.token_hit_rate, cfg.min_token_hit_rate),
                               ("any-hit request rate", s.request_hit_rate, cfg.min_request_hit_rate),
                               ("full-hit request rate", s.full_hit_rate, cfg.min_full_hit_rate)):
        if bound is not None and rate is not None and rate < bound:
            problems.append(f"{phase}: {label} {_pct(rate)} < {_pct(bound)}")
    if cfg.stored_prefix_full_hit:
        missed = [h for h in hits if h.looked_up and h.stored_prefix_tokens > 0 and h.recomputed_stored_tokens > 0]
        d["stored_prefix_misses"] = [
            {"request_id": h.request_id, "stored_prefix_tokens": h.stored_prefix_tokens,
             "stored_by": h.stored_prefix_source, "lmcache_tokens": h.lmcache_tokens, "local_tokens": h.local_tokens,
             "recomputed_stored_tokens": h.recomputed_stored_tokens} for h in missed[:SHOWN]]
        if s.stored_prefix_requests == 0:
            unknowns.append(f"{phase}: no request re-sent a prefix stored earlier (stored_prefix_full_hit "
                            "cannot be decided)")
        elif missed:
            h = missed[0]
            problems.append(
                f"{phase}: {len(missed)} of {s.stored_prefix_requests} requests re-sending a stored prefix "
                f"recomputed part of it (first: {h.request_id}: {h.stored_prefix_tokens} tokens stored by "
                f"{h.stored_prefix_source}, {h.lmcache_tokens} from LMCache + {h.local_tokens} local)")
    if cfg.min_correct_hit_rate is not None:
        if s.hits_checked == 0:
            unknowns.append(f"{phase}: no LMCache hit with a recompute expectation (correct-hit rate not measured)")
        elif s.correct_hit_rate is not None and s.correct_hit_rate < cfg.min_correct_hit_rate:
            problems.append(f"{phase}: correct-hit rate {_pct(s.correct_hit_rate)} "
                            f"({s.correct_hits} of {s.hits_checked} hits equal recompute) < "
                            f"{_pct(cfg.min_correct_hit_rate)}")
    verdict: Verdict = "failed" if problems else ("unknown" if unknowns else "passed")
    d["verdict"] = verdict
    return verdict, problems, unknowns, d


def _needs(cfg: HitQualityConfig) -> set[str]:
    """The correct-hit rate compares each hit's output with the recompute twin's."""
    return {"recompute"} if cfg.min_correct_hit_rate is not None else set()


@register(NAME, HitQualityConfig, needs=("engine.cache_stats",), needs_for=_needs)
def check(history: Sequence[Op | dict[str, Any]], snapshots: Snapshots,
          config: HitQualityConfig | dict[str, Any] | None = None) -> CheckResult:
    """Per-phase hit rates, stored-prefix full hits and the correct-hit rate, against the bounds.

    Args:
        history: the run's ops.
        snapshots: ``chunk_size`` (stored prefixes) and ``expected`` (correct-hit rate; empty: not
            measured).
        config: HitQualityConfig (``phases`` required).
    Returns:
        CheckResult; details: ``phases`` (phase -> HitSummary fields plus ``verdict`` and
        ``stored_prefix_misses``), ``problems`` (bounds missed, one line each), ``undecided``
        (what could not be decided), ``bounds``, ``correct_hit_rate_measured``.
    """
    cfg = coerce_config(config, HitQualityConfig)
    recs = requests(history)
    stored_from = recs if cfg.stored_phases is None else [r for r in recs if r.phase in cfg.stored_phases]
    matches = output_matches(recs, snapshots.expected) if snapshots.expected else None
    hits = request_hits(recs, chunk_size=snapshots.chunk_size, matches=matches, stored_from=stored_from)
    per_phase: dict[str, Any] = {}
    problems: list[str] = []
    unknowns: list[str] = []
    verdicts: list[Verdict] = []
    for phase in cfg.phases:
        v, bad, undecided, d = _judge_phase(phase, [h for h in hits if h.phase == phase], cfg)
        per_phase[phase] = d
        verdicts.append(v)
        problems.extend(bad)
        unknowns.extend(undecided)
    verdict = worst(verdicts)
    lines = problems + unknowns
    details = {"phases": per_phase, "problems": problems, "undecided": unknowns,
               "bounds": cfg.model_dump(exclude={"phases", "stored_phases", "min_requests"}, exclude_none=True),
               "correct_hit_rate_measured": matches is not None}
    rates = "; ".join(
        f"{p}: token {_pct(d.get('token_hit_rate'))}, any {_pct(d.get('request_hit_rate'))}, "
        f"full {_pct(d.get('full_hit_rate'))}, correct-hit {_pct(d.get('correct_hit_rate'))}"
        for p, d in per_phase.items())
    if verdict == "passed":
        return CheckResult(name=NAME, verdict=verdict, summary=f"hit quality met ({rates})", details=details)
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    return CheckResult(name=NAME, verdict=verdict, summary=lines[0] + more, details=details)
