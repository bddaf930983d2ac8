"""chaos/vllm/model.py: the tiny Llama and its tokenizer are built deterministically and load
in transformers as vLLM loads them."""

from __future__ import annotations

import dataclasses

import pytest

from chaos.vllm.model import FILES, TinyLlama, build, file_digests


def test_same_seed_builds_byte_identical_files(tmp_path):
    a = file_digests(build(tmp_path / "a"))
    b = file_digests(build(tmp_path / "b"))
    assert sorted(a) == sorted(FILES)
    assert a == b


def test_another_seed_changes_only_the_weights_and_config(tmp_path):
    a = file_digests(build(tmp_path / "a"))
    c = file_digests(build(tmp_path / "c", TinyLlama(seed=1)))
    changed = {n for n in FILES if a[n] != c[n]}
    assert changed == {"model.safetensors", "config.json"}


def test_tokenizer_covers_the_vocabulary_and_round_trips(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(build(tmp_path / "m")))
    assert len(tok) == TinyLlama().vocab_size
    text = "the quick brown fox, 42 times; ünïcode too"
    assert tok.decode(tok.encode(text)) == text
    # every id decodes (the random model may generate any of them)
    assert all(isinstance(tok.decode([i]), str) for i in range(len(tok)))


def test_model_loads_and_its_output_depends_on_the_context(tmp_path):
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(build(tmp_path / "m")))
    ids = torch.arange(40, 100).unsqueeze(0)
    first = model.generate(ids, max_new_tokens=8, do_sample=False)[0, -8:].tolist()
    ids[0, 0] = 41  # one token changed far back must change the output
    second = model.generate(ids, max_new_tokens=8, do_sample=False)[0, -8:].tolist()
    assert first != second


def test_inconsistent_spec_is_refused(tmp_path):
    with pytest.raises(ValueError, match="num_kv_heads"):
        build(tmp_path / "m", dataclasses.replace(TinyLlama(), num_kv_heads=3))
    with pytest.raises(ValueError, match="vocab_size"):
        build(tmp_path / "m", dataclasses.replace(TinyLlama(), vocab_size=100))
