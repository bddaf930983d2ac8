"""EngineCore in-process (no HTTP, no LMCache): batching, preemption, prefix cache, bugs."""

from __future__ import annotations

import random

import pytest

from chaos.engine.config import EngineConfig
from chaos.engine.model import ModelSpec
from chaos.engine.request import Request, TokenEvent
from chaos.engine.scheduler import EngineCore, RequestRejected

SPEC = ModelSpec(num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2,
                 intermediate_size=256)


def make_core(**kw) -> EngineCore:
    return EngineCore(EngineConfig(model=SPEC, **kw))


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def run(core: EngineCore, prompts: list[list[int]], max_tokens: int = 48,
        on_step=None) -> list[list[int]]:
    """Submit all prompts, step until every request finished; return the token ids."""
    outs: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for i, p in enumerate(prompts):
        req = Request(request_id=f"r{i}", prompt=p, max_tokens=max_tokens, ignore_eos=True)

        def sink(ev: TokenEvent, i: int = i) -> None:
            if ev.final:
                done[i] = True
            else:
                outs[i].append(ev.token_id)
        req.sink = sink
        core.add_request(req)
    for step in range(20000):
        with core.state_lock:
            core.step()
        if on_step:
            on_step(core, step)
        if all(done):
            return outs
    raise AssertionError("requests did not finish")


@pytest.fixture(scope="module")
def reference() -> dict:
    core = make_core(num_blocks=1024)
    prompts = [prompt(i, 600) for i in range(8)]
    return {"prompts": prompts, "outs": run(core, prompts)}


def test_preemption_under_block_pressure_equals_recompute(reference: dict) -> None:
    # 8 x (600 + 48) tokens need 328 blocks; 80 blocks hold two requests at a time.
    core = make_core(num_blocks=80)
    outs = run(core, reference["prompts"])
    assert core.metrics.get("vllm:num_preemptions_total") > 0
    assert outs == reference["outs"]
    assert core.metrics.get("kvchaos_engine_replay_mismatches_total") == 0
    assert core.blocks.num_free == 80


def test_prefix_cache_hits_equal_recompute(reference: dict) -> None:
    core = make_core(num_blocks=1024, enable_prefix_caching=True)
    p = reference["prompts"]
    first = run(core, p[:2])
    again = run(core, p[:2])
    assert core.metrics.get("vllm:prefix_cache_hits_total") == 2 * 512
    assert first == again == reference["outs"][:2]


def test_hook_preempt_and_resume(reference: dict) -> None:
    core = make_core(num_blocks=1024)
    preempted: list[str] = []

    def on_step(c: EngineCore, step: int) -> None:
        if step in (3, 30):
            preempted.extend(c._run_hook("preempt", "all"))
    outs = run(core, reference["prompts"][:3], on_step=on_step)
    assert preempted and core.metrics.get("vllm:num_preemptions_total") == len(preempted)
    assert outs == reference["outs"][:3]


def test_stale_blocks_on_resume_bug_changes_output(reference: dict) -> None:
    """Preempt r0 mid-decode; r1 reuses r0's freed blocks; the bug resumes on stale KV."""
    core = make_core(num_blocks=80, bugs=["stale-blocks-on-resume"])
    outs = run(core, reference["prompts"][:4])
    assert core.metrics.get("vllm:num_preemptions_total") > 0
    assert outs != reference["outs"][:4]


def test_request_larger_than_pool_is_rejected() -> None:
    core = make_core(num_blocks=8)
    with pytest.raises(RequestRejected, match="exceeds the KV block pool"):
        core.add_request(Request(request_id="big", prompt=[1] * 120, max_tokens=16))
