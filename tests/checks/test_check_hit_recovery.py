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
