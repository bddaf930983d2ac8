"""hit_quality: per-phase LMCache token and request hit rates, full hits of re-sent stored
prefixes, and the correct-hit rate; unknown when a phase has too few samples or the case it
must judge never happened."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from chaos.checks.config import HitQualityConfig
from chaos.checks.hit_quality import check
from chaos.checks.snapshots import Snapshots

C = 256
FAMILY = [list(range(i * 1000, i * 1000 + 2 * C)) for i in range(4)]  # two full chunks each


def prompt(family: int, suffix: int) -> list[int]:
    return FAMILY[family] + [7, suffix % 250, 3]


def warm_then_recover(hb, recover_external, *, recover_local=None, tokens=None, expected=None):
    """warm: one cold request per family (stores 2 chunks each); recover: the same families again."""
    for f in range(4):
        hb.request(f"w-{f}", prompt(f, f), [1, 2], t0=f * 0.1, t1=1 + f * 0.1, phase="warm")
    for i, ext in enumerate(recover_external):
        local = (recover_local or [0] * len(recover_external))[i]
        hb.request(f"r-{i}", prompt(i % 4, 100 + i), (tokens or {}).get(f"r-{i}", [1, 2]), t0=5 + i, t1=6 + i,
                   external=ext, local=local, phase="recover")
    return Snapshots(expected=expected or {})


def test_full_hits_of_stored_prefixes_pass(hb):
    snaps = warm_then_recover(hb, [2 * C] * 4)
    r = check(hb.ops, snaps, HitQualityConfig(phases=["recover"], min_token_hit_rate=0.9,
                                              min_request_hit_rate=1.0, stored_prefix_full_hit=True))
    assert r.verdict == "passed", r.summary
    d = r.details["phases"]["recover"]
    assert d["token_hit_rate"] == pytest.approx(4 * 2 * C / (4 * (2 * C + 3)))
    assert d["stored_prefix_requests"] == 4 and d["stored_prefix_full_hits"] == 4


def test_one_token_per_request_passes_hit_recovery_but_not_hit_quality(hb):
    """What hit_recovery accepts (>= 1 token from LMCache each) is a 50% token hit rate here: a
    stored prefix of two chunks came back with one."""
    snaps = warm_then_recover(hb, [C] * 4)
    r = check(hb.ops, snaps, HitQualityConfig(phases=["recover"], min_request_hit_rate=1.0,
                                              stored_prefix_full_hit=True))
    assert r.verdict == "failed"
    assert "4 of 4 requests re-sending a stored prefix recomputed part of it" in r.summary
    miss = r.details["phases"]["recover"]["stored_prefix_misses"][0]
    assert miss["stored_prefix_tokens"] == 2 * C and miss["lmcache_tokens"] == C and miss["stored_by"] == "w-0"
    r = check(hb.ops, snaps, HitQualityConfig(phases=["recover"], min_token_hit_rate=0.9))
    assert r.verdict == "failed" and "LMCache token hit rate 50% < 90%" in r.summary


def test_the_engines_own_prefix_cache_is_not_counted_as_lmcache(hb):
    snaps = warm_then_recover(hb, [0] * 4, recover_local=[2 * C] * 4)
    r = check(hb.ops, snaps, HitQualityConfig(phases=["recover"], min_token_hit_rate=0.5))
    assert r.verdict == "failed" and r.details["phases"]["recover"]["local_tokens"] == 4 * 2 * C
    # ... but local reuse of a stored prefix is not a recompute of it
    r = check(hb.ops, snaps, HitQualityConfig(phases=["recover"], stored_prefix_full_hit=True))
    assert r.verdict == "passed", r.summary


def test_correct_hit_rate_next_to_the_hit_rate(hb):
    exp = {f"r-{i}": [1, 2] for i in range(4)} | {f"w-{f}": [1, 2] for f in range(4)}
    snaps = warm_then_recover(hb, [2 * C] * 4, tokens={"r-2": [9, 9]}, expected=exp)
    r = check(hb.ops, snaps, HitQualityConfig(phases=["recover"], min_request_hit_rate=0.9))
    assert r.verdict == "passed"  # not bounded: reported
    d = r.details["phases"]["recover"]
    assert d["request_hit_rate"] == 1.0 and d["correct_hit_rate"] == 0.75 and "correct-hit 75%" in r.summary
    r = check(hb.ops, snaps, HitQualityConfig(phases=["recover"], min_correct_hit_rate=1.0))
    assert r.verdict == "failed" and "correct-hit rate 75% (3 of 4 hits equal recompute)" in r.summary


def test_correct_hit_rate_without_expectations_is_unknown(hb):
    snaps = warm_then_recover(hb, [2 * C] * 4)
    r = check(hb.ops, snaps, HitQualityConfig(phases=["recover"], min_correct_hit_rate=1.0))
    assert r.verdict == "unknown" and "not measured" in r.summary


def test_too_few_samples_is_unknown(hb):
    snaps = warm_then_recover(hb, [2 * C] * 2)
    r = check(hb.ops, snaps, HitQualityConfig(phases=["recover"], min_request_hit_rate=0.5))
    assert r.verdict == "unknown" and "too few samples" in r.summary
    r = check(hb.ops, snaps, HitQualityConfig(phases=["recover"], min_request_hit_rate=0.5, min_requests=2))
    assert r.verdict == "passed"


def test_no_stored_prefix_re_sent_is_unknown(hb):
    """The check is asked to judge full hits of re-sent stored prefixes: with none re-sent (every
    recover prompt is new), it cannot decide."""
    for i in range(4):
        hb.request(f"r-{i}", list(range(50_000 + i * 600, 50_000 + i * 600 + 600)), [1], t0=i, t1=i + 1,
                   phase="recover")
    r = check(hb.ops, Snapshots(), HitQualityConfig(phases=["recover"], stored_prefix_full_hit=True))
    assert r.verdict == "unknown" and "no request re-sent a prefix stored earlier" in r.summary


def test_stored_prefixes_respect_tenants_order_and_the_last_token(hb):
    # another tenant's prompt is not "stored" for this tenant; a prompt still running is not stored;
    # a prompt of exactly two chunks can only reuse the first (the last token is never loaded)
    hb.request("a", FAMILY[0] + [1], [1], t0=0, t1=1, tenant="t1", phase="warm")
    hb.request("b", FAMILY[0] + [2], [1], t0=2, t1=3, tenant="t2", external=0, phase="recover")
    hb.request("c", FAMILY[1] + [1], [1], t0=0, t1=9, phase="warm")
    hb.request("d", FAMILY[1] + [2], [1], t0=5, t1=6, phase="recover")
    hb.request("e", FAMILY[0], [1], t0=4, t1=5, tenant="t1", external=C, phase="recover")
    hb.request("f", FAMILY[0] + [3], [1], t0=4, t1=5, tenant="t1", external=C, phase="recover")
    r = check(hb.ops, Snapshots(), HitQualityConfig(phases=["recover"], stored_prefix_full_hit=True,
                                                    min_requests=1))
    d = r.details["phases"]["recover"]
    assert d["stored_prefix_requests"] == 2  # e and f
    assert r.verdict == "failed" and [m["request_id"] for m in d["stored_prefix_misses"]] == ["f"]


def test_config_needs_a_bound_and_known_phases():
    with pytest.raises(ValidationError, match="at least one of"):
        HitQualityConfig(phases=["recover"])
    from chaos.scenario.model import Scenario

    with pytest.raises(ValidationError, match="checks.hit_quality names unknown phase"):
        Scenario.model_validate({"name": "t", "stack": "s.yml", "phases": [{"name": "warm"}],
                                 "checks": {"hit_quality": {"phases": ["recover"], "min_token_hit_rate": 0.5}}},
                                context={"check_paths": False})
