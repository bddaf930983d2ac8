"""The HTTP contract (docs/architecture.md §2): completions, stream, errors, metrics, hooks."""

from __future__ import annotations

import json
import threading
import time

import pytest
from engine_procs import Engine, ids, random_prompt, stats

pytestmark = pytest.mark.slow

VLLM_METRICS = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total",
    "vllm:kv_cache_usage_perc", "vllm:request_success_total",
    "kvchaos_engine_lookup_timeouts_total", "kvchaos_engine_load_failures_total",
    "kvchaos_engine_aborts_total",
]


def assert_vllm_error(resp, code: int = 400) -> dict:
    assert resp.status_code == code, resp.text
    body = resp.json()
    assert body["object"] == "error" and body["code"] == code
    assert body["type"] == ("BadRequestError" if code == 400 else "InternalServerError")
    assert body["message"]
    return body


def test_text_prompt_and_response_shape(twin: Engine) -> None:
    r = twin.complete("Hello, kvchaos!", 5, logprobs=2)
    c = r["choices"][0]
    assert r["object"] == "text_completion" and r["id"].startswith("cmpl-")
    assert c["prompt_token_ids"] == list("Hello, kvchaos!".encode())
    assert 1 <= len(c["token_ids"]) <= 5 and c["finish_reason"] in ("length", "stop")
    assert len(c["logprobs"]["token_logprobs"]) == len(c["token_ids"])
    assert all(len(t) == 2 for t in c["logprobs"]["top_logprobs"])
    u = r["usage"]
    assert u["prompt_tokens"] == 15 and u["total_tokens"] == 15 + len(c["token_ids"])
    assert u["prompt_tokens_details"]["cached_tokens"] == 0
    assert stats(r) == {"local_cache_hit_tokens": 0, "external_cache_hit_tokens": 0,
                        "lookup": "disabled", "load_failed_tokens": 0, "num_preemptions": 0}


def test_request_id_header(twin: Engine) -> None:
    r = twin.client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1},
                         headers={"X-Request-Id": "my-id-1"})
    assert r.json()["id"] == "cmpl-my-id-1"


def test_stream_equals_non_stream(twin: Engine) -> None:
    p = random_prompt("http:77", 300)
    whole = twin.complete(p, 10, ignore_eos=True)
    events = []
    with twin.client.stream("POST", "/v1/completions",
                            json={"prompt": p, "max_tokens": 10, "stream": True,
                                  "ignore_eos": True}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    streamed = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert streamed == ids(whole)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 10
    assert "cached_token_stats" in last["kv_transfer_params"]


@pytest.mark.parametrize("payload,param", [
    ('{"prompt": [1, 2', None),
    ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": -3}, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": 4, "frobnicate": True}, "frobnicate"),
    ({"prompt": [], "max_tokens": 4}, "prompt"),
    ({"prompt": [1, 99999], "max_tokens": 4}, "prompt"),
    ({"prompt": [1, 2], "max_tokens": 4, "temperature": 0.7}, "temperature"),
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": [5] * 40000, "max_tokens": 4}, "prompt"),
])
def test_bad_requests_get_400_and_engine_keeps_serving(twin: Engine, payload, param) -> None:
    if isinstance(payload, str):
        r = twin.client.post("/v1/completions", content=payload,
                             headers={"content-type": "application/json"})
    else:
        r = twin.client.post("/v1/completions", json=payload)
    body = assert_vllm_error(r, 400)
    if param:
        assert param in (body["param"] or "") or param in body["message"]
    assert twin.client.get("/health").status_code == 200
    assert len(ids(twin.complete([1, 2, 3], 2))) >= 1


def test_metrics_use_vllm_names(twin: Engine) -> None:
    twin.complete([7] * 40, 2)
    text = twin.client.get("/metrics").text
    for name in VLLM_METRICS:
        assert f"\n{name}" in "\n" + text, name
    assert twin.metric("vllm:request_success_total") >= 1
    assert twin.metric("vllm:prefix_cache_queries_total") >= 40


def test_models_and_debug_state(twin: Engine) -> None:
    m = twin.client.get("/v1/models").json()["data"][0]
    state = twin.state()
    assert m["id"] == "kvchaos-ref" and m["fingerprint"] == state["fingerprint"]
    for key in ("blocks_total", "blocks_free", "blocks_held_by_requests",
                "prefix_cache_blocks", "num_open_sessions", "open_sessions",
                "num_pending_lookups", "pending_lookups", "requests", "num_running",
                "num_waiting", "bugs"):
        assert key in state, key
    assert state["bugs"] == [] and state["blocks_held_by_requests"] == 0


def test_hook_preempt_running_request(twin: Engine) -> None:
    p = random_prompt("http:88", 400)
    ref = ids(twin.complete(p, 300, ignore_eos=True))
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(
        twin.complete(p, 300, ignore_eos=True)))
    t.start()
    preempted: list = []
    deadline = time.monotonic() + 30
    while not preempted and time.monotonic() < deadline and t.is_alive():
        preempted = twin.client.post("/hooks/preempt", json={"request_id": "newest"}
                                     ).json()["preempted"]
        time.sleep(0.05)
    t.join(timeout=120)
    assert preempted, "the request finished before it could be preempted"
    assert stats(result)["num_preemptions"] >= 1
    assert ids(result) == ref
    assert twin.client.post("/hooks/preempt", json={"request_id": "nobody"}
                            ).json() == {"preempted": []}


def test_hook_lmcache_raw_calls(twin: Engine, engine: Engine, lmcache_stack) -> None:
    """``POST /hooks/lmcache``: one raw call of LMCache's scheduler adapter (docs/findings/).
    On a healthy link LOOKUP + end_session leaves no session behind; bad input is a 400, an
    engine without LMCache a 503."""
    body = {"call": "lookup_then_end_session", "request_id": "raw-hook-0", "tokens": 512}
    assert twin.client.post("/hooks/lmcache", json=body).status_code == 503
    assert_vllm_error(engine.client.post("/hooks/lmcache", json={**body, "call": "nope"}))
    assert_vllm_error(engine.client.post("/hooks/lmcache", json={**body, "tokens": 100}))
    before = lmcache_stack.status()["active_sessions"]
    r = engine.client.post("/hooks/lmcache", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["adapter_healthy_before"] and out["adapter_healthy_after"], out
    assert out["end_session_returned_after_s"] < 2.0
    deadline = time.monotonic() + 10
    while lmcache_stack.status()["active_sessions"] != before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert lmcache_stack.status()["active_sessions"] == before
    assert engine.client.get("/debug/state").json()["num_open_sessions"] == 0


def test_non_stream_client_disconnect_aborts(twin: Engine) -> None:
    import httpx

    aborts = twin.metric("kvchaos_engine_aborts_total")
    body = {"prompt": random_prompt("http:99", 400), "max_tokens": 1500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(twin.base + "/v1/completions", json=body, timeout=0.5,
                   headers={"X-Request-Id": "gone"})
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        state = twin.state()
        if "gone" not in state["requests"] and twin.metric("kvchaos_engine_aborts_total") > aborts:
            break
        time.sleep(0.1)
    assert "gone" not in state["requests"]
    assert twin.metric("kvchaos_engine_aborts_total") == aborts + 1
    assert state["blocks_held_by_requests"] == 0


def test_request_stages_and_where_an_abort_landed(twin: Engine) -> None:
    """/debug/requests/{id}: a watch registered before the request is sent sees it enter decode;
    the stage an abort arrived in is kept after the request ended; unknown ids are 404."""
    import httpx

    assert twin.client.get("/debug/requests/nobody").status_code == 404
    assert twin.client.get("/debug/requests/x", params={"wait_for": "nowhere"}).status_code == 400
    body = {"prompt": random_prompt("http:stages", 300), "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=twin.base, timeout=60) as http:
        with http.stream("GET", "/debug/requests/st-1", params={"wait_for": "decode", "timeout_s": 60}) as watch:
            lines = watch.iter_lines()
            first = json.loads(next(lines))
            assert first == {"request_id": "st-1", "watching": "decode", "stage": None}
            with http.stream("POST", "/v1/completions", json=body, headers={"X-Request-Id": "st-1"}) as resp:
                second = json.loads(next(lines))
                assert second["reached"] is True and second["entered"] == "decode"
                next(resp.iter_lines())  # a token arrived; now close the stream: an abort in decode
    deadline = time.monotonic() + 5
    view = {}
    while time.monotonic() < deadline:
        view = twin.client.get("/debug/requests/st-1").json()
        if view["stage"] == "aborted":
            break
        time.sleep(0.05)
    assert view["stage"] == "aborted" and view["abort"] == {"arrived_in": "decode", "handled_in": "decode"}
    # a watch for a stage an ended request never entered (no connector: no load) answers at once
    twin.client.post("/v1/completions", json={"prompt": random_prompt("http:stages2", 20), "max_tokens": 2},
                     headers={"X-Request-Id": "st-2"}).raise_for_status()
    t0 = time.monotonic()
    got = twin.client.get("/debug/requests/st-2", params={"wait_for": "load", "timeout_s": 30})
    last = json.loads(got.text.strip().splitlines()[-1])
    assert last["reached"] is False and last["entered"] == "finished" and time.monotonic() - t0 < 5
    # an id never sent: waited for until timeout_s
    got = twin.client.get("/debug/requests/none-yet", params={"wait_for": "load", "timeout_s": 0.2})
    last = json.loads(got.text.strip().splitlines()[-1])
    assert last["reached"] is False and last["stage"] is None


def test_debug_kv_shows_the_prompt_kv_a_request_attends_over(twin: Engine) -> None:
    """``/debug/kv`` (issue 34): the prompt KV from the request's own blocks, once, after its
    prefill. A longer prompt's first canonical segment (256 tokens, computed alike) holds the
    same KV bit for bit."""
    import torch

    def capture(rid: str, prompt: list[int]) -> torch.Tensor:
        assert twin.client.post(f"/debug/kv/{rid}").status_code == 200
        r = twin.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2},
                             headers={"X-Request-Id": rid})
        assert r.status_code == 200, r.text
        got = twin.client.get(f"/debug/kv/{rid}")
        assert got.status_code == 200, got.text
        shape = [int(x) for x in got.headers["x-kv-shape"].split(",")]
        assert got.headers["x-kv-dtype"] == "float32" and got.headers["x-kv-external-hit-tokens"] == "0"
        assert twin.client.get(f"/debug/kv/{rid}").status_code == 404  # answered once
        return torch.frombuffer(bytearray(got.content), dtype=torch.float32).reshape(shape)

    p = random_prompt("debug-kv:1", 256)
    short = capture("kv-short", p)
    long = capture("kv-long", p + random_prompt("debug-kv:2", 20))
    assert short.shape[0] == 2 and short.shape[2] == 256 and long.shape[2] == 276
    assert torch.equal(long[:, :, :256], short) and bool((short[0, 0] != 0).any())
    assert not torch.equal(long[:, :, 256:], torch.zeros_like(long[:, :, 256:]))
    assert twin.client.get("/debug/kv/never-armed").status_code == 404
