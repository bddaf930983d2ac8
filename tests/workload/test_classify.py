from __future__ import annotations

import pytest

from chaos.history import Op
from chaos.workload.classify import REQUEST_CLASSES, classify


def _op(type_="ok", prompt_len=100, aborted=False, **stats):
    full = {"local_cache_hit_tokens": 0, "external_cache_hit_tokens": 0, "lookup": "miss",
            "load_failed_tokens": 0, "num_preemptions": 0, **stats}
    return Op(index=1, time=0.0, process="client-0", type=type_, f="complete", request_id="r",
              value={"prompt_len": prompt_len, "aborted": aborted, "cached_token_stats": full})


@pytest.mark.parametrize(
    "op, expected",
    [
        (_op(), "cold_miss"),
        (_op(local_cache_hit_tokens=64), "local_hit"),
        (_op(external_cache_hit_tokens=99, lookup="hit"), "lmcache_hit_full"),
        (_op(local_cache_hit_tokens=32, external_cache_hit_tokens=67, lookup="hit"), "lmcache_hit_full"),
        (_op(external_cache_hit_tokens=64, lookup="hit"), "lmcache_hit_partial"),
        (_op(lookup="timeout", local_cache_hit_tokens=16), "lookup_timeout"),
        (_op(external_cache_hit_tokens=64, load_failed_tokens=64, lookup="hit"), "load_failure_recompute"),
        (_op("fail"), "failed"),
        (_op("info"), "failed"),
        (_op("info", aborted=True), "aborted"),
    ],
)
def test_classes(op, expected):
    assert classify(op) == expected
    assert expected in REQUEST_CLASSES


def test_missing_stats_is_cold_miss_and_invoke_is_refused():
    op = Op(index=0, time=0, process="client-0", type="ok", f="complete", value={})
    assert classify(op) == "cold_miss"
    with pytest.raises(ValueError):
        classify(Op(index=0, time=0, process="client-0", type="invoke", f="complete"))
    with pytest.raises(ValueError):
        classify(Op(index=0, time=0, process="nemesis", type="ok", f="apply"))


def test_lmcache_mp_connector_stats_are_mapped_to_the_reference_names():
    """vLLM + LMCacheMPConnector answer num_vllm_cached_tokens / num_lmcache_cached_tokens /
    num_lmcache_extra_cached_tokens (LMCacheMPConnector.request_finished)."""
    from chaos.checks.requests import _stats
    from chaos.workload.classify import classify_value, normalize_cache_stats

    raw = {"num_vllm_cached_tokens": 256, "num_lmcache_cached_tokens": 768, "num_lmcache_extra_cached_tokens": 512}
    assert normalize_cache_stats(raw) == {"local_cache_hit_tokens": 256, "external_cache_hit_tokens": 512}
    assert classify_value("ok", {"cached_token_stats": raw, "prompt_len": 800}) == "lmcache_hit_partial"
    assert classify_value("ok", {"cached_token_stats": raw, "prompt_len": 769}) == "lmcache_hit_full"
    assert _stats({"cached_token_stats": raw}).external_cache_hit_tokens == 512
    ref = {"local_cache_hit_tokens": 1, "external_cache_hit_tokens": 2, "lookup": "hit"}
    assert normalize_cache_stats(ref) is ref
