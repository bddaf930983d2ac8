"""hit_recovery: LMCache hits must come back in the phases after a fault (F11)."""

from __future__ import annotations

from chaos.checks.config import HitRecoveryConfig
from chaos.checks.hit_recovery import check
from chaos.checks.snapshots import Snapshots
from chaos.history import HistoryWriter


def history(phase_hits: dict[str, list[int]]):
    h = HistoryWriter(None)
    n = 0
    for phase, ext in phase_hits.items():
        for tokens in ext:
            rid = f"{phase}-{n}"
            n += 1
            h.append("client-0", "invoke", "complete", phase=phase, request_id=rid,
                     value={"prompt_token_ids": [1] * 300, "prompt_len": 300, "max_tokens": 4})
            h.append("client-0", "ok", "complete", phase=phase, request_id=rid,
                     value={"token_ids": [1, 2, 3, 4], "prompt_len": 300,
                            "cached_token_stats": {"local_cache_hit_tokens": 0, "external_cache_hit_tokens": tokens,
                                                   "lookup": "hit" if tokens else "miss"}})
    return h.ops


def test_hits_recovered():
    r = check(history({"outage": [0, 0], "recover": [0, 256, 256, 256]}), Snapshots(),
              HitRecoveryConfig(phases=["recover"], min_request_hit_rate=0.5))
    assert r.verdict == "passed", r.summary
    assert r.details["request_hit_rate"] == 0.75


def test_hits_stuck_at_zero_fail():
    r = check(history({"recover": [0, 0, 0, 256]}), Snapshots(),
              HitRecoveryConfig(phases=["recover"], min_request_hit_rate=0.5))
    assert r.verdict == "failed"
    assert "hits did not recover" in r.summary and "1 of 4" in r.summary


def test_no_requests_in_phase_is_unknown():
    r = check(history({"warm": [0, 256]}), Snapshots(), HitRecoveryConfig(phases=["recover"]))
    assert r.verdict == "unknown"


def _with_failed_loads(n_hits: int, failed: int, misses: int = 0):
    """``n_hits`` LMCache hits, ``failed`` lookups that found their prefix and failed to load,
    ``misses`` plain misses, all in phase after-restart."""
    h = HistoryWriter(None)
    rows = [(256, "hit", 0)] * n_hits + [(0, "hit", 768)] * failed + [(0, "miss", 0)] * misses
    for i, (ext, lookup, load_failed) in enumerate(rows):
        rid = f"after-restart-{i}-0"
        h.append("client-0", "invoke", "complete", phase="after-restart", request_id=rid,
                 value={"prompt_token_ids": [1] * 300, "prompt_len": 300, "max_tokens": 4})
        h.append("client-0", "ok", "complete", phase="after-restart", request_id=rid,
                 value={"token_ids": [1, 2, 3, 4], "prompt_len": 300,
                        "cached_token_stats": {"local_cache_hit_tokens": 0, "external_cache_hit_tokens": ext,
                                               "lookup": lookup, "load_failed_tokens": load_failed}})
    return h.ops


def test_a_shortfall_of_failed_loads_only_is_unknown_not_failed():
    """Input: ladder-engine-restart at load average 20-27 (issue 34 acceptance 3, 2026-12-07):
    after the engine's restart 5 of 6 requests hit LMCache; the sixth found its 768-token prefix
    (lookup hit) but its retrieve was answered past the MQ timeout, so it recomputed
    (load_failed_tokens 768): failed at 83% < 90% on the clean engine."""
    cfg = HitRecoveryConfig(phases=["after-restart"], min_request_hit_rate=0.9)
    r = check(_with_failed_loads(5, 1), Snapshots(), cfg)
    assert r.verdict == "unknown", r.summary
    assert r.details["lookup_hit_load_failed"] == ["after-restart-5-0"] and "their load failed" in r.summary
    # a plain miss among them still fails; so does a shortfall the failed loads do not cover
    assert check(_with_failed_loads(4, 1, misses=1), Snapshots(), cfg).verdict == "failed"
    assert check(_with_failed_loads(5, 0, misses=1), Snapshots(), cfg).verdict == "failed"
    assert check(_with_failed_loads(6, 0), Snapshots(), cfg).verdict == "passed"
