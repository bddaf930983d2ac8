"""Prometheus text as a leak source and as evidence: selectors with label matchers (PromQL
syntax), summed over the matching series, read by the runner's poll (chaos/runner/leaks.py)
from a real HTTP server."""

from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler

import pytest

from chaos.prometheus import parse_selector, sum_selectors
from chaos.runner.leaks import at_baseline, poll_until_quiet, read_baselines
from chaos.stack.spec import LeakSource
from kvchaos_support import http_server

TEXT = """# HELP vllm:num_requests_running Requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 2.0
vllm:num_requests_running{engine="1",model_name="b"} 1.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="a"} 7.0
"""


def test_selectors_and_matchers():
    got = sum_selectors(TEXT, {
        "all": "vllm:num_requests_running",
        "a": 'vllm:num_requests_running{model_name="a"}',
        "not_a": 'vllm:num_requests_running{model_name!="a"}',
        "re": 'vllm:num_requests_running{engine=~"[01]",model_name!~"z.*"}',
        "counter": "vllm:num_preemptions_total",
        "absent": "vllm:kv_cache_usage_perc",
        "no_label": 'vllm:num_requests_running{nope="x"}',
    })
    assert got == {"all": 3.0, "a": 2.0, "not_a": 1.0, "re": 3.0, "counter": 7.0, "absent": None,
                   "no_label": None}
    assert str(parse_selector('m{a="1", b=~"x|y"}')) == 'm{a="1",b=~"x|y"}'


@pytest.mark.parametrize("bad", ["", "1metric", 'm{a=1}', 'm{a="x"', 'm{a=~"("}', 'm{a="1" b="2"}'])
def test_bad_selectors_are_refused(bad):
    with pytest.raises(ValueError):
        parse_selector(bad)


def test_a_stack_leak_source_with_a_bad_selector_is_a_config_error():
    """The message names the field and what a selector must look like, never the file's value
    (a stack file may be any file on the host: issue 34)."""
    with pytest.raises(ValueError, match="fields.x: not a Prometheus selector") as err:
        LeakSource(name="m", url="http://x/metrics", format="prometheus", fields={"x": "m{a=1}"})
    assert "a=1" not in str(err.value).split("input_value")[0]


def test_at_baseline():
    assert at_baseline(0.0, None) and not at_baseline(-1.0, None) and not at_baseline(None, 0.0)
    assert at_baseline(0.2, 0.25) and not at_baseline(0.3, 0.25) and not at_baseline(0.0, float("nan"))


class Gauges(BaseHTTPRequestHandler):
    """Serves a running gauge that drops to its baseline after a few reads."""

    reads = 0

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        cls = type(self)
        cls.reads += 1
        running = 1.0 if cls.reads < 4 else 0.0
        body = (f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="a"}} {running}\n'
                '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="a"} 0.1\n').encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_poll_waits_until_every_gauge_is_back_at_its_baseline():
    Gauges.reads = 0
    with http_server(Gauges) as port:
        src = LeakSource(name="m", url=f"http://127.0.0.1:{port}/metrics", format="prometheus",
                         baseline="before_faults",
                         fields={"running": "vllm:num_requests_running", "usage": "vllm:kv_cache_usage_perc"})
        Gauges.reads = 10  # the baseline read sees the idle engine
        baselines = read_baselines([src])
        assert baselines == {"m": {"running": 0.0, "usage": 0.1}}
        Gauges.reads = 0
        t0 = time.monotonic()
        samples, errors, waited = poll_until_quiet([src], 5.0, 0.05, lambda: time.monotonic() - t0,
                                                   baselines=baselines)
    assert not errors and samples[-1].values == {"running": 0.0, "usage": 0.1}
    assert len(samples) == 4 and waited < 5.0
