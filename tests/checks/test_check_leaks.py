from chaos.checks import LeakError, LeakSample, Snapshots, leaks


def _samples(source, series, field="read_locked_count"):
    return [LeakSample(source=source, time=10 + i * 0.5, values={field: v, "active_sessions": 0})
            for i, v in enumerate(series)]


def test_counters_reaching_zero_pass():
    snap = Snapshots(leak_samples=_samples("lmcache", [3, 1, 0]) + _samples("engine", [0], "open_sessions"))
    r = leaks.check([], snap, {"quiesce_s": 10})
    assert r.verdict == "passed", r.summary
    assert r.details["sources"]["lmcache"]["peak"]["read_locked_count"] == 3


def test_a_lock_that_stays_at_one_fails_with_last_value_and_wait():
    snap = Snapshots(leak_samples=_samples("lmcache", [2, 1, 1, 1]), quiesce_waited_s=10.0)
    r = leaks.check([], snap, {"quiesce_s": 10})
    assert r.verdict == "failed"
    assert r.summary == "still held after 10s of quiesce: lmcache.read_locked_count=1"
    assert r.details["leaked"] == [{"source": "lmcache", "field": "read_locked_count", "value": 1, "peak": 2}]


def test_only_the_final_sample_counts():
    # A counter that was 0 then went up again at the end is still a leak.
    snap = Snapshots(leak_samples=_samples("engine", [0, 0, 4], "blocks_held_by_requests"))
    assert leaks.check([], snap, None).verdict == "failed"


def test_source_never_read_is_unknown():
    snap = Snapshots(leak_samples=_samples("lmcache", [0]),
                     leak_errors=[LeakError(source="engine", time=11.0, error="connection refused")])
    r = leaks.check([], snap, {})
    assert r.verdict == "unknown"
    assert "engine: connection refused" in r.summary


def test_configured_source_without_any_reading_is_unknown():
    cfg = {"sources": [{"name": "redis", "url": "http://127.0.0.1:1/x", "fields": {"n": "n"}}]}
    r = leaks.check([], Snapshots(leak_samples=_samples("lmcache", [0])), cfg)
    assert r.verdict == "unknown" and "redis" in r.details["unread_sources"]


def test_leak_beats_unreadable_source():
    snap = Snapshots(leak_samples=_samples("lmcache", [1]),
                     leak_errors=[LeakError(source="engine", time=1.0, error="timeout")])
    assert leaks.check([], snap, {}).verdict == "failed"


def test_no_source_at_all_is_unknown():
    assert leaks.check([], Snapshots(), {}).verdict == "unknown"


def test_missing_field_in_final_reading_is_unknown():
    snap = Snapshots(leak_samples=[LeakSample(source="lmcache", time=1, values={"staging_bytes": None})])
    assert leaks.check([], snap, {}).verdict == "unknown"


def _gauges(series):
    return [LeakSample(source="engine-metrics", time=10 + i, values={"kv_cache_usage": v, "running": 0.0})
            for i, v in enumerate(series)]


def test_before_faults_baseline_gauge_back_at_baseline_passes():
    snap = Snapshots(leak_samples=_gauges([0.5, 0.25]),
                     leak_baselines={"engine-metrics": {"kv_cache_usage": 0.25, "running": 0.0}})
    r = leaks.check([], snap, None)
    assert r.verdict == "passed", r.summary
    assert r.details["sources"]["engine-metrics"]["baseline"]["kv_cache_usage"] == 0.25


def test_before_faults_baseline_gauge_above_baseline_fails_naming_it():
    snap = Snapshots(leak_samples=_gauges([0.5, 0.3]), quiesce_waited_s=4.0,
                     leak_baselines={"engine-metrics": {"kv_cache_usage": 0.25, "running": 0.0}})
    r = leaks.check([], snap, None)
    assert r.verdict == "failed"
    assert r.summary == "still held after 4s of quiesce: engine-metrics.kv_cache_usage=0.3 (baseline 0.25)"


def test_below_baseline_is_not_a_leak_but_an_unread_baseline_is_unknown():
    below = Snapshots(leak_samples=_gauges([0.1]), leak_baselines={"engine-metrics": {"kv_cache_usage": 0.25,
                                                                                      "running": 0.0}})
    assert leaks.check([], below, None).verdict == "passed"
    unread = Snapshots(leak_samples=_gauges([0.0]), leak_baselines={"engine-metrics": {"kv_cache_usage": None,
                                                                                       "running": 0.0}})
    r = leaks.check([], unread, None)
    assert r.verdict == "unknown" and "kv_cache_usage (baseline before the faults)" in r.summary
