"""hit_recovery: after a fault heals, LMCache hits come back (field report F11).

A client that never reconnects after the cache server restarted keeps serving correct output
(every request recomputes), so recompute equivalence passes while the hit rate sits at zero
for good. This check looks at the requests of the named phases, which run after the fault
healed: the fraction of completed requests served at least one token from LMCache
(``cached_token_stats.external_cache_hit_tokens > 0``) must reach ``min_request_hit_rate``.

A request whose lookup found its prefix in LMCache but whose load failed
(``lookup == "hit"``, ``load_failed_tokens > 0``, nothing loaded) shows the engine reached
LMCache again; the load itself may have failed for the host's sake (a retrieve answered past
the engine's MQ timeout on a loaded host: the restarted engine of ladder-engine-restart, at load
average 20-27 on two cores, 2026-12-07) or for the stack's. When the rate reaches the minimum
only with those counted, the verdict is unknown with their ids, never passed nor failed.

Verdicts: failed below the minimum (also with the failed loads counted); unknown when those
phases completed no request (or the engine reported no cached_token_stats), or when only the
failed loads keep the rate below the minimum; passed otherwise.
"""

from __future__ import annotations

from typing import Any, Sequence

from chaos.checks.config import HitRecoveryConfig
from chaos.checks.registry import coerce_config, register
from chaos.checks.requests import requests
from chaos.checks.result import CheckResult
from chaos.checks.snapshots import Snapshots
from chaos.history import Op

NAME = "hit_recovery"


@register(NAME, HitRecoveryConfig, needs=("engine.cache_stats",))
def check(history: Sequence[Op | dict[str, Any]], snapshots: Snapshots,
          config: HitRecoveryConfig | dict[str, Any] | None = None) -> CheckResult:
    """Request hit rate from LMCache over the requests of ``config.phases``.

    Returns:
        CheckResult; details: ``phases``, ``completed``, ``lmcache_hits``, ``request_hit_rate``,
        ``min_request_hit_rate``, ``without_stats`` (completed requests with no stats),
        ``lookup_hit_load_failed`` (ids of requests whose lookup hit and whose load failed).
    """
    cfg = coerce_config(config, HitRecoveryConfig)
    done = [r for r in requests(history) if r.phase in cfg.phases and r.outcome == "ok"]
    with_stats = [r for r in done if r.cached_token_stats is not None]
    hits = [r for r in with_stats if (r.cached_token_stats.external_cache_hit_tokens or 0) > 0]
    details = {"phases": cfg.phases, "completed": len(done), "lmcache_hits": len(hits),
               "without_stats": len(done) - len(with_stats), "min_request_hit_rate": cfg.min_request_hit_rate}
    where = ", ".join(cfg.phases)
    if not with_stats:
        return CheckResult(name=NAME, verdict="unknown", details=details,
                           summary=f"no completed request with cached_token_stats in phase(s) {where}")
    rate = len(hits) / len(with_stats)
    found = [r for r in with_stats if r not in hits and r.cached_token_stats.lookup == "hit"
             and (r.cached_token_stats.load_failed_tokens or 0) > 0]
    details["request_hit_rate"] = rate
    details["lookup_hit_load_failed"] = [r.request_id for r in found]
    summary = (f"{len(hits)} of {len(with_stats)} requests in {where} hit LMCache "
               f"({rate:.0%}; at least {cfg.min_request_hit_rate:.0%} required)")
    if rate < cfg.min_request_hit_rate:
        if found and (len(hits) + len(found)) / len(with_stats) >= cfg.min_request_hit_rate:
            return CheckResult(name=NAME, verdict="unknown", details=details,
                               summary=f"{summary}; {len(found)} more found their prefix in LMCache but their load "
                               f"failed (first {found[0].request_id}): the engine reached LMCache again, whether "
                               "its loads fail for the host's sake or the stack's cannot be told")
        return CheckResult(name=NAME, verdict="failed", summary="hits did not recover: " + summary, details=details)
    return CheckResult(name=NAME, verdict="passed", summary=summary, details=details)
