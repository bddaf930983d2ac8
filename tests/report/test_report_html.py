import json
import re
from html.parser import HTMLParser

import pytest

from chaos.report.html import render_html


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _parse(html):
    p = _Collect()
    p.feed(html)
    return p.tags


def test_html_has_timeline_checks_stats_and_links(run_dir, synthetic):
    ops, _, result = synthetic
    html = (run_dir / "report.html").read_text()
    tags = _parse(html)
    classes = [a.get("class", "") for _, a in tags]
    assert any(c == "phase" for c in classes) and sum(c == "phase-boundary" for c in classes) == 3
    assert sum(c == "fault-band" for c in classes) == 2 and sum(c == "fault" for c in classes) == 2
    bars = [a for t, a in tags if t == "rect" and "bar" in a.get("class", "").split()]
    assert len(bars) == result.stats.requests
    planted = result.checks[0].details["mismatches"][0]["request_id"]
    wrong = [a for a in bars if "wrong" in a["class"].split()]
    assert [a["data-request-id"] for a in wrong] == [planted]
    failed = [a for a in bars if "failedreq" in a["class"].split()]
    assert [a["data-request-id"] for a in failed] == ["w-40"]
    assert {a["data-class"] for a in bars} >= {"cold_miss", "lmcache_hit_partial", "lookup_timeout", "failed", "aborted"}
    assert any(c == "service-exit" for c in classes)
    assert 'id="checks"' in html and 'id="stats"' in html and "token_hit_rate" in html
    hrefs = [a["href"] for t, a in tags if t == "a"]
    assert "logs/engine.log" in hrefs and "logs/lmcache.log" in hrefs and "history.jsonl" in hrefs


def test_html_is_self_contained(run_dir):
    html = (run_dir / "report.html").read_text()
    assert not re.search(r"""(src|href)=["'](https?:)?//""", html)
    assert "<link" not in html and "@import" not in html
    assert "<script src" not in html


def test_overlapping_requests_of_one_process_get_separate_lanes(synthetic):
    _, _, result = synthetic
    ops = []
    for i, (t0, t1) in enumerate([(0, 4), (1, 2), (5, 6)]):
        ops.append({"index": 2 * i, "time": t0, "process": "client-0", "type": "invoke", "f": "complete",
                    "phase": "warm", "request_id": f"r{i}", "value": {"prompt_token_ids": [1, 2]}})
        ops.append({"index": 2 * i + 1, "time": t1, "process": "client-0", "type": "ok", "f": "complete",
                    "phase": "warm", "request_id": f"r{i}", "value": {"token_ids": [3]}})
    ys = {a["data-request-id"]: float(a["y"]) for t, a in _parse(render_html(result, ops)) if "data-request-id" in a}
    assert ys["r0"] == ys["r2"] != ys["r1"]


def test_html_escapes_text(synthetic):
    ops, _, result = synthetic
    result = result.model_copy(update={"description": "<script>alert(1)</script>"})
    assert "<script>alert(1)" not in render_html(result, ops)


def test_correct_hit_rate_is_shown_next_to_the_hit_rate(run_dir, synthetic):
    """The planted wrong output is an LMCache hit: result.json and the stats table show the
    correct-hit rate below 100% next to the hit rate."""
    _, _, result = synthetic
    st = result.stats
    assert st.hits_checked > 0 and st.correct_hits == st.hits_checked - 1
    assert st.correct_hit_rate == pytest.approx((st.hits_checked - 1) / st.hits_checked)
    data = json.loads((run_dir / "result.json").read_text())["stats"]
    assert data["correct_hit_rate"] == st.correct_hit_rate and "recover" in data["by_phase"]
    html = (run_dir / "report.html").read_text()
    row = html[html.index('<table id="stats">'):html.index('<table id="phase-hits"')]
    assert "correct-hit rate" in row and f"({st.correct_hits} of {st.hits_checked})" in row
    assert 'id="phase-hits"' in html



def test_the_proxy_that_served_the_run_is_in_the_html_junit_and_result(tmp_path, synthetic):
    from chaos.report import write_report
    from chaos.report.junit import run_testsuite

    from .conftest import synthetic_result

    ops, snaps, plain = synthetic
    assert plain.proxy is None and "<b>proxy</b><span>–</span>" in render_html(plain, ops)
    info = {"impl": "real", "version": "2.9.0", "binary": "/opt/toxiproxy-server", "api": "http://127.0.0.1:1"}
    result = synthetic_result(ops, snaps, proxy=info)
    d = tmp_path / result.run_id
    write_report(d, result, ops)
    assert json.loads((d / "result.json").read_text())["proxy"] == info
    assert "<b>proxy</b><span>real 2.9.0 (/opt/toxiproxy-server)</span>" in (d / "report.html").read_text()
    props = {p.get("name"): p.get("value") for p in run_testsuite(result).iter("property")}
    assert props["proxy"] == "real 2.9.0"
