"""A Prometheus leak source catches an engine-side leak through ``/metrics`` alone.

The planted bug ``hold-blocks-on-abort`` drops an aborted request from the engine's table but
never frees its KV blocks. ``/debug/state``'s ``blocks_held_by_requests`` counts the table, so
the JSON leak source passes; ``vllm:kv_cache_usage_perc`` on ``/metrics`` stays above what it
read before the fault, so the Prometheus source (the form compose/vllm-lmcache.yml uses for
vLLM, which has no JSON debug state) fails the ``leaks`` check. The clean engine passes both.
Real engine processes, the runner's own polling (chaos/runner/leaks.py) and the real check.
"""

from __future__ import annotations

import time

import httpx
import pytest
from engine_procs import random_prompt

from chaos.checks import leaks
from chaos.checks.config import LeaksConfig
from chaos.checks.snapshots import Snapshots
from chaos.runner.leaks import poll_until_quiet, read_baselines
from chaos.stack.spec import LeakSource

pytestmark = pytest.mark.slow


def _abort_after_first_tokens(base: str, prompt: list[int], request_id: str) -> None:
    body = {"prompt": prompt, "max_tokens": 200, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=base, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body, headers={"X-Request-Id": request_id}) as r:
            assert r.status_code == 200
            for n, _line in enumerate(r.iter_lines()):
                if n >= 4:
                    break


def _verdict(source: LeakSource, baselines: dict) -> tuple[str, str]:
    t0 = time.monotonic()
    samples, errors, waited = poll_until_quiet([source], 4.0, 0.2, lambda: time.monotonic() - t0,
                                               baselines=baselines)
    snaps = Snapshots(leak_sources=[source.name], leak_samples=samples, leak_errors=errors,
                      quiesce_waited_s=waited, leak_baselines=baselines)
    res = leaks.check([], snaps, LeaksConfig())
    return res.verdict, res.summary


@pytest.mark.parametrize("planted", [False, True])
def test_prometheus_source_alone_catches_blocks_held_after_abort(planted: bool, make_engine) -> None:
    args = ["--num-blocks", "256", "--kv-connector", "none"] + (["--bug", "hold-blocks-on-abort"] if planted else [])
    eng = make_engine("hold-blocks" if planted else "clean-blocks", args, wait_lmcache=False)
    metrics = LeakSource(name="engine-metrics", url=f"{eng.base}/metrics", format="prometheus",
                         baseline="before_faults",
                         fields={"requests_running": 'vllm:num_requests_running{model_name=~"kvchaos.*"}',
                                 "requests_waiting": "vllm:num_requests_waiting",
                                 "kv_cache_usage": "vllm:kv_cache_usage_perc"})
    debug_state = LeakSource(name="engine", url=f"{eng.base}/debug/state",
                             fields={"blocks_held_by_requests": "blocks_held_by_requests",
                                     "open_sessions": "num_open_sessions"})
    baselines = read_baselines([metrics])  # before the fault, as the runner does
    assert baselines["engine-metrics"]["kv_cache_usage"] == 0.0
    for i in range(2):
        _abort_after_first_tokens(eng.base, random_prompt(f"hold:{i}", 300), f"abort-{planted}-{i}")
    eng.complete(random_prompt("hold:after", 100), 4)  # the engine keeps serving

    verdict, summary = _verdict(metrics, baselines)
    assert verdict == ("failed" if planted else "passed"), summary
    if planted:
        assert "engine-metrics.kv_cache_usage" in summary and "baseline 0" in summary
    # The JSON debug state cannot see blocks that no request in the table owns.
    assert _verdict(debug_state, {})[0] == "passed"
