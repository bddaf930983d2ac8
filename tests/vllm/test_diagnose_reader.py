"""`kvchaos diagnose` reads LMCache's copy of a prompt stored by vLLM CPU (chaos/diagnose/lmcache.py
KVReader, with compose/vllm-cpu.yml's declared kv_layout): a real LMCache server, KV written by
vLLM's own CPU cache-write kernel into vLLM CPU's paged layout and stored through LMCache's worker
adapter as LMCache's vLLM connector registers it (tests/vllm/cpu_attn_store.py, in the vLLM venv).

The input that showed the bug: the reader registered its buffer as K and V planes
(``[2, blocks, 16, 1, hidden]``, hint NHD) while vLLM CPU registers ``[blocks, heads, 128,
2 x head size]`` (hint HND); LMCache served it vLLM's objects, its scatter failed ("shape '[16,
16, 1, 256]' is invalid for input of size 256") and every retrieve was answered as failed, so
`kvchaos diagnose` said ``unknown`` for store-wrong-blocks on the vLLM stack."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from chaos.diagnose.lmcache import KVReader, server_info
from chaos.stack.spec import load_stack
from chaos.vllm.cli import vllm_python
from kvchaos_support import LMCACHE_FS_STACK, local_stack, started

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "compose" / "vllm-cpu.yml"


@pytest.mark.slow
def test_the_reader_reads_what_vllm_cpu_stored_as_vllm_wrote_it(tmp_path):
    import torch

    layout = load_stack(STACK, environ=dict(os.environ), run_dir=tmp_path / "spec", require_commands=False,
                        allocate_ports=False).settings.kv_layout
    assert layout is not None and layout.paged == "cpu_attn" and layout.block_size is None  # read from vLLM
    with started(local_stack(tmp_path, LMCACHE_FS_STACK)) as stack:
        info = server_info(stack.settings.lmcache_http)
        # 128: the stack's block size; 32: its block size under ENGINE_NUM_BLOCKS (the smallest
        # vLLM's CPU attention takes). Both stored by one process: importing vLLM, torch and
        # LMCache is most of its time.
        stores = [(block_size, tokens, f"vllm-cpu-bs{block_size}") for block_size, tokens in ((128, 512), (32, 768))]
        r = subprocess.run([str(vllm_python()), "tests/vllm/cpu_attn_store.py", info.zmq_url,
                            *[str(a) for bs, n, model in stores for a in (model, bs, n, tmp_path / f"{model}.pt")]],
                           capture_output=True, text=True, timeout=600, cwd=REPO)
        assert r.returncode == 0, r.stderr[-3000:]
        for block_size, tokens, model in stores:
            stored = torch.load(tmp_path / f"{model}.pt")
            assert stored["hint"] == "HND"
            with KVReader(info.zmq_url, model, num_layers=layout.num_layers, hidden_dim=layout.hidden_dim,
                          dtype=layout.dtype, chunk_size=info.chunk_size, paged=layout.paged,
                          num_kv_heads=layout.num_kv_heads, block_size=block_size) as reader:
                assert reader.lookup(stored["tokens"], reserve_last_token=False) == tokens
                n, kv = reader.read(stored["tokens"])
            assert n == tokens and kv is not None
            chunks = tokens // info.chunk_size
            want = stored["kv"].reshape(2, layout.num_layers, chunks, info.chunk_size, layout.hidden_dim)
            assert torch.equal(kv, want.permute(2, 0, 1, 3, 4)), (block_size, stored["isa"])
