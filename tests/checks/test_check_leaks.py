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


def test_a_session_left_open_fails_alone():
    # Issue 17: with `leaks` made to ignore active_sessions the whole suite still passed. A
    # leaked LMCache session (locks all 0) must fail by itself, named in the summary.
    snap = Snapshots(leak_samples=[
        LeakSample(source="lmcache", time=1.0, values={"read_locked_count": 2, "active_sessions": 3}),
        LeakSample(source="lmcache", time=2.0, values={"read_locked_count": 0, "active_sessions": 1}),
        LeakSample(source="engine", time=2.0, values={"open_sessions": 0, "pending_lookups": 0})],
        quiesce_waited_s=4.5)
    r = leaks.check([], snap, {"quiesce_s": 10})
    assert r.verdict == "failed"
    assert r.summary == "still held after 4.5s of quiesce: lmcache.active_sessions=1"
    assert r.details["leaked"] == [{"source": "lmcache", "field": "active_sessions", "value": 1, "peak": 3}]


def test_every_nonzero_field_of_every_source_is_listed():
    snap = Snapshots(leak_samples=[
        LeakSample(source="lmcache", time=1.0, values={"active_sessions": 1, "staging_bytes": 4096}),
        LeakSample(source="engine", time=1.0, values={"open_sessions": 2, "blocks_held_by_requests": 0})])
    r = leaks.check([], snap, None)
    assert r.summary == ("still held after 15s of quiesce: lmcache.active_sessions=1, "
                         "lmcache.staging_bytes=4096, engine.open_sessions=2")


def test_passing_reading_names_its_sources_and_details():
    snap = Snapshots(leak_samples=_samples("lmcache", [1, 0]) + _samples("engine", [0], "open_sessions"),
                     leak_sources=["lmcache", "engine"],
                     leak_errors=[LeakError(source="engine", time=9.0, error="slow")])
    r = leaks.check([], snap, {"quiesce_s": 7})
    assert r.verdict == "passed"
    assert r.summary == "all counters of lmcache, engine are back at their baseline after quiesce"
    d = r.details
    assert d["waited_s"] == 7 and d["leaked"] == [] and d["unread_sources"] == [] and d["missing_fields"] == []
    assert d["sources"]["lmcache"] == {"samples": 2, "errors": 0, "last_error": None,
                                      "final": {"read_locked_count": 0, "active_sessions": 0},
                                      "peak": {"read_locked_count": 1, "active_sessions": 0}, "time": 10.5}
    assert d["sources"]["engine"]["errors"] == 1 and d["sources"]["engine"]["last_error"] == "slow"


def test_sources_in_config_order_then_snapshot_order():
    cfg = {"sources": [{"name": "engine", "url": "http://127.0.0.1:1/x", "fields": {"n": "n"}}]}
    snap = Snapshots(leak_sources=["redis"], leak_samples=_samples("lmcache", [0]) + _samples("engine", [0], "n"),
                     leak_errors=[LeakError(source="proxy", time=1.0, error="refused")])
    r = leaks.check([], snap, cfg)
    assert list(r.details["sources"]) == ["engine", "redis", "lmcache", "proxy"]
    assert r.verdict == "unknown"
    assert r.summary == "leak source could not be read: redis: never polled; proxy: refused"


def test_samples_are_ordered_by_time_and_none_values_skip_the_peak():
    snap = Snapshots(leak_samples=[
        LeakSample(source="lmcache", time=3.0, values={"n": 0}),
        LeakSample(source="lmcache", time=1.0, values={"n": 5}),
        LeakSample(source="lmcache", time=2.0, values={"n": None})])
    r = leaks.check([], snap, {})
    assert r.verdict == "passed"  # the last reading in time is 0, whatever the list order
    assert r.details["sources"]["lmcache"]["peak"] == {"n": 5}


def test_missing_field_summary_names_it():
    snap = Snapshots(leak_samples=[LeakSample(source="lmcache", time=1, values={"staging_bytes": None, "x": 0})])
    r = leaks.check([], snap, {})
    assert r.summary == "field missing from the final reading: lmcache.staging_bytes"
    assert r.details["missing_fields"] == ["lmcache.staging_bytes"]


def test_reference_stack_polls_sessions_as_well_as_locks(tmp_path):
    # The check is only as good as its sources: the reference stack must report LMCache's
    # sessions and the engine's open sessions and pending lookups, not just locks.
    from pathlib import Path

    from chaos.stack.spec import load_stack

    spec = load_stack(Path(__file__).parents[2] / "compose" / "reference.yml", environ={},
                      run_dir=tmp_path, allocate_ports=False)
    fields = {f"{s.name}.{k}" for s in spec.settings.leak_sources for k in s.fields}
    assert {"lmcache.active_sessions", "lmcache.read_locked_count", "lmcache.write_locked_count",
            "lmcache.staging_bytes", "engine.open_sessions", "engine.pending_lookups",
            "engine.blocks_held_by_requests"} <= fields


def test_twin_never_inherits_planted_bugs_or_coverage(tmp_path):
    # The stack's variables reach every service's environment; the recompute twin runs the same
    # engine code and must stay clean (no planted bug, not measured).
    from pathlib import Path

    from chaos.stack.spec import load_stack

    spec = load_stack(Path(__file__).parents[2] / "compose" / "reference.yml",
                      environ={"KVCHAOS_ENGINE_BUGS": "drop-cache-salt", "KVCHAOS_ENGINE_COVERAGE": "/x/rc"},
                      run_dir=tmp_path, allocate_ports=False)
    twin = spec.services["engine-recompute"].env()
    engine = spec.services["engine"].env()
    assert twin["KVCHAOS_ENGINE_BUGS"] == "" and twin["KVCHAOS_ENGINE_COVERAGE"] == ""
    assert engine["KVCHAOS_ENGINE_BUGS"] == "drop-cache-salt" and engine["KVCHAOS_ENGINE_COVERAGE"] == "/x/rc"
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
