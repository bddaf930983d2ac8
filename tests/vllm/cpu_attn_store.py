"""Store KV into an LMCache MP server the way vLLM CPU does, for tests/vllm/test_diagnose_reader.py
(run with the vLLM venv's Python from the repository root, never collected by pytest).

    python tests/vllm/cpu_attn_store.py URL MODEL BLOCK_SIZE TOKENS OUT [MODEL BLOCK_SIZE TOKENS OUT ...]

(several stores in one process: importing vLLM, torch and LMCache takes most of its time.)

The paged KV is vLLM CPU's own: per layer ``[blocks, kv heads, block size, 2 x head size]``
(vLLM's logical ``[B, H, N, C]``, layout ``LBHNC``), filled by vLLM's own cache-write kernel
(``ops.cpu_attn_reshape_and_cache`` on the K/V views ``CPUAttentionBackendImpl.forward``
makes, with the ISA its ``_get_attn_isa`` picks), and registered with LMCache's worker adapter
under the layout hint LMCache's vLLM integration derives from the CPU backend
(``translate_vllm_kv_cache_layout``), as LMCache's ``LMCacheMPConnector.register_kv_caches``
does. The prompt's KV (random, seed 0; block 0 is LMCache's null block, so the prompt sits in
blocks 1..) is stored under cache_salt "" and written to OUT as ``{"tokens": [...], "kv":
[2, layers, tokens, kv heads x head size]}`` (torch.save) for the reader to be held against.
"""

from __future__ import annotations

import sys
import time

import chaos.vllm.launch  # noqa: F401  (the "+cpu" version answer: vLLM's CPU platform, AVX2 build)

LAYERS, HEADS, HEAD_SIZE = 4, 4, 64  # the tiny Llama's (chaos/vllm/model.py)


def main(url: str, model: str, block_size: int, tokens: int, out: str) -> None:
    import torch
    import zmq
    from lmcache.integration.vllm.utils import translate_vllm_kv_cache_layout
    from lmcache.integration.vllm.vllm_multi_process_adapter import (
        LMCacheMPWorkerAdapter,
        LoadStoreOp,
        ParallelStrategy,
    )
    from lmcache.v1.multiprocess.group_view import EngineGroupInfo
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, _get_attn_isa

    nb = tokens // block_size
    hint = translate_vllm_kv_cache_layout(CPUAttentionBackend.supported_kv_cache_layouts()[0].name)
    isa = _get_attn_isa(torch.float32, block_size, HEAD_SIZE)
    gen = torch.Generator().manual_seed(0)
    caches, kv = {}, torch.empty(2, LAYERS, tokens, HEADS * HEAD_SIZE)
    slots = torch.arange(block_size, block_size + tokens, dtype=torch.int64)  # blocks 1..nb
    for layer in range(LAYERS):
        cache = torch.zeros(1 + nb, HEADS, block_size, 2 * HEAD_SIZE)
        key_cache, value_cache = cache.view(1 + nb, HEADS, 2 * block_size, HEAD_SIZE).chunk(2, dim=2)
        k = torch.randn(tokens, HEADS, HEAD_SIZE, generator=gen)
        v = torch.randn(tokens, HEADS, HEAD_SIZE, generator=gen)
        ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa)
        kv[0, layer], kv[1, layer] = k.reshape(tokens, -1), v.reshape(tokens, -1)
        caches[f"model.layers.{layer}.self_attn.attn"] = cache
    strategy = ParallelStrategy(mla_only=False, vllm_world_size=1, vllm_worker_id=0, tp_size=1, pp_size=1,
                                n_servers=1)
    worker = LMCacheMPWorkerAdapter(url, zmq.Context.instance(), model, block_size, strategy,
                                    extra_config={"lmcache.mp.mq_timeout": 30})
    try:
        worker.register_kv_caches(caches, [EngineGroupInfo(engine_group_id=0, layer_indices=tuple(range(LAYERS)),
                                                           tokens_per_block=block_size)], {"kv_layout": hint})
        prompt = list(range(7, 7 + tokens))
        worker.submit_store_request("store-1", LoadStoreOp(token_ids=prompt, block_ids=[list(range(1, 1 + nb))],
                                                           start=0, end=tokens), None, cache_salt="")
        future = worker.store_futures["store-1"]
        deadline = time.monotonic() + 60
        while not future.query():
            if time.monotonic() > deadline:
                raise SystemExit("LMCache did not finish the store in 60 s")
            time.sleep(0.01)
        if not future.result(timeout=0):
            raise SystemExit("LMCache answered the store as failed")
        torch.save({"tokens": prompt, "kv": kv, "isa": isa, "hint": hint}, out)
    finally:
        worker.shutdown()


if __name__ == "__main__":
    args = sys.argv[2:]
    if not args or len(args) % 4:
        raise SystemExit(__doc__)
    for i in range(0, len(args), 4):
        main(sys.argv[1], args[i], int(args[i + 1]), int(args[i + 2]), args[i + 3])
