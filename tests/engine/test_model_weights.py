"""The reference engine's own Llama modules against transformers' ``LlamaForCausalLM``.

``chaos.engine.model`` used to build transformers' ``LlamaForCausalLM`` only to hold its
weights (the forward pass was already ours); it now holds them in modules of its own, so that an
engine process does not import transformers (about 3 CPU-s a start). These tests keep the old
construction (transformers' model, seeded, filled in ``sorted(name)`` order, cast to the dtype)
and check, bit for bit, that nothing moved: the parameters' names, shapes, dtypes and values,
and the logits of ``PagedLlama.forward`` over a prompt, its continuation and decode steps, which
run transformers' ``LlamaRMSNorm``, ``LlamaMLP``, ``nn.Embedding`` and ``nn.Linear`` in the old
construction and ours in the new one.
"""

from __future__ import annotations

import pytest
import torch

from chaos.engine.kv_pool import KVPool
from chaos.engine.model import ModelSpec, PagedLlama

transformers = pytest.importorskip("transformers")

SPECS = [
    # float32, GQA 4 -> 2, two layers.
    ModelSpec(num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256,
              vocab_size=300, seed=3),
    # bfloat16, GQA 8 -> 2, three layers (the norms' and the MLP's casts matter here).
    ModelSpec(num_layers=3, hidden_size=128, num_heads=8, num_kv_heads=2, intermediate_size=192,
              vocab_size=320, dtype="bfloat16", seed=11),
    # float32, no grouping (MHA), the engine's default init std and another seed.
    ModelSpec(num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=2, intermediate_size=96,
              vocab_size=259, seed=0),
]


def _old_paged_llama(spec: ModelSpec) -> PagedLlama:
    """``PagedLlama`` as chaos/engine/model.py built it before (transformers holds the weights)."""
    config = transformers.LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        initializer_range=spec.init_std,
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = transformers.LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * spec.init_std)
    model = model.to(spec.torch_dtype).eval()
    old = PagedLlama.__new__(PagedLlama)
    old.spec = spec
    old.model = model
    old.batch_noise = 0.0
    old._layers = model.model.layers
    old._scale = spec.head_size ** -0.5
    old._inv_freq = 1.0 / (config.rope_theta if hasattr(config, "rope_theta") else 10000.0) ** (
        torch.arange(0, spec.head_size, 2, dtype=torch.float32) / spec.head_size)
    return old


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.dtype}-{s.num_heads}q{s.num_kv_heads}kv")
def test_parameters_equal_transformers_llama(spec: ModelSpec) -> None:
    old = dict(_old_paged_llama(spec).model.named_parameters())
    new = dict(PagedLlama(spec).model.named_parameters())
    assert sorted(new) == sorted(old)
    for name, p in old.items():
        q = new[name]
        assert (q.shape, q.dtype) == (p.shape, p.dtype), name
        assert torch.equal(q, p), name
    # Buffers the forward pass could read (transformers' rotary inv_freq is recomputed by ours).
    assert dict(PagedLlama(spec).model.named_buffers()) == {}


def _run(model: PagedLlama, prompt: list[int], more: list[int], decode: list[int]) -> list[torch.Tensor]:
    """Logits of a prompt (two canonical-size segments), its continuation, then decode steps."""
    spec = model.spec
    pool = KVPool(spec.num_layers, 16, 16, spec.num_kv_heads, spec.head_size, spec.torch_dtype)
    table = [5, 2, 9, 0, 7, 3]
    out = [model.forward(prompt[:32], 0, table, pool), model.forward(prompt[32:], 32, table, pool)]
    out.append(model.forward(more, len(prompt), table, pool))
    pos = len(prompt) + len(more)
    for t in decode:
        out.append(model.forward([t], pos, table, pool))
        pos += 1
    # The KV each construction wrote must be the same bits as well.
    out.extend(pool.layers)
    return out


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.dtype}-{s.num_heads}q{s.num_kv_heads}kv")
def test_logits_equal_the_transformers_construction(spec: ModelSpec) -> None:
    g = torch.Generator().manual_seed(spec.seed + 100)
    ids = torch.randint(0, spec.vocab_size, (64,), generator=g).tolist()
    prompt, more, decode = ids[:40], ids[40:57], ids[57:61]
    old = _run(_old_paged_llama(spec), prompt, more, decode)
    new = _run(PagedLlama(spec), prompt, more, decode)
    assert len(new) == len(old)
    for i, (a, b) in enumerate(zip(old, new)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert torch.equal(a, b), f"output {i} differs: max |diff| {(a.float() - b.float()).abs().max()}"
    # The logits are not all equal to each other (a model that ignored its input would pass).
    assert not torch.equal(new[0], new[1])

