"""The vLLM CPU stack's model: a tiny seeded random Llama and a fixed byte-level BPE tokenizer,
written into a folder vLLM serves (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``, ``generation_config.json``), with no download and no training.

Same :class:`TinyLlama` -> byte-identical files: the weights come from one seeded
``torch.Generator`` drawn in a fixed order and are written with ``safetensors`` (its header lists
tensors in a fixed order); the JSON files are written with sorted keys; the tokenizer's
vocabulary and merges are a fixed function of the byte alphabet (no trainer, so no tie-breaking
or threading can change them).

Tokenizer (``tokenizers`` byte-level BPE): ids 0-2 are ``<unk>``, ``<s>``, ``</s>``; ids
3-258 the 256 byte symbols (GPT-2's byte-to-unicode alphabet, sorted); ids 259 onwards merges of
lowercase letter pairs and of a space before a letter, until ``vocab_size``. Every id below
``vocab_size`` decodes, so whatever the random model generates detokenizes.

Weights: the names and shapes of transformers' ``LlamaForCausalLM`` (what vLLM's Llama loader
reads), normal init with ``init_std`` (larger than the usual 0.02, as the reference engine's
model, so that the output depends on the whole context and wrong KV changes tokens), norms 1.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["TinyLlama", "build", "file_digests"]

SPECIALS = ("<unk>", "<s>", "</s>")
BOS_ID = 1
EOS_ID = 2
#: Files :func:`build` writes, in order.
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json")


@dataclass(frozen=True)
class TinyLlama:
    """Shape and seed of the model (defaults: about 13 MB in float32).

    Attributes:
        num_layers: decoder layers.
        hidden_size: model width; ``hidden_size % num_heads == 0``.
        num_heads: query heads.
        num_kv_heads: KV heads; ``num_heads % num_kv_heads == 0``.
        intermediate_size: MLP width.
        vocab_size: embedding rows = tokenizer entries (at least 259 + 1).
        max_position_embeddings: longest sequence (tokens).
        seed: the ``torch.Generator`` seed of the weights.
        init_std: std of the normal init of every matrix.
    """

    num_layers: int = 4
    hidden_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 512
    vocab_size: int = 1024
    max_position_embeddings: int = 4096
    seed: int = 0
    init_std: float = 0.08

    def validate(self) -> None:
        """Raises ValueError naming the field that is out of range."""
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.vocab_size <= len(SPECIALS) + 256:
            raise ValueError(f"vocab_size {self.vocab_size} must exceed {len(SPECIALS) + 256} "
                             "(specials and byte symbols)")
        if self.vocab_size > len(SPECIALS) + 256 + len(_merge_pairs(_byte_symbols())):
            raise ValueError(f"vocab_size {self.vocab_size} is larger than the fixed merge list allows")

    @property
    def head_dim(self) -> int:
        """Per-head width (elements)."""
        return self.hidden_size // self.num_heads


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, sorted (``tokenizers``' ByteLevel alphabet)."""
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet())


def _merge_pairs(symbols: list[str]) -> list[tuple[str, str]]:
    """The fixed merge list: a space (``Ġ``) before each lowercase letter, every pair of
    lowercase letters, then a spaced letter before a letter."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    space = "Ġ"
    assert space in symbols
    pairs = [(space, c) for c in letters]
    pairs += [(a, b) for a in letters for b in letters]
    pairs += [(space + a, b) for a in letters for b in letters]
    return pairs


def tokenizer_json(spec: TinyLlama) -> str:
    """The ``tokenizer.json`` text of the fixed byte-level BPE with ``spec.vocab_size`` entries."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    symbols = _byte_symbols()
    vocab: dict[str, int] = {s: i for i, s in enumerate(SPECIALS)}
    for s in symbols:
        vocab[s] = len(vocab)
    merges: list[tuple[str, str]] = []
    for a, b in _merge_pairs(symbols):
        if len(vocab) >= spec.vocab_size:
            break
        vocab[a + b] = len(vocab)
        merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    if tok.get_vocab_size() != spec.vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} entries, want {spec.vocab_size}")
    return tok.to_str(pretty=True)


def config_json(spec: TinyLlama) -> dict:
    """transformers' ``LlamaConfig`` fields for ``spec`` (what vLLM reads from config.json)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": spec.init_std,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "mlp_bias": False,
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "num_key_value_heads": spec.num_kv_heads,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "vocab_size": spec.vocab_size,
        "kvchaos_tiny_llama": asdict(spec),
    }


def weights(spec: TinyLlama) -> dict:
    """The model's tensors by transformers' ``LlamaForCausalLM`` names (float32, contiguous).

    Drawn from one ``torch.Generator(seed)`` in the order of this function, so the same spec
    gives the same bits on any machine with the same torch."""
    import torch

    g = torch.Generator().manual_seed(spec.seed)
    h, kv = spec.hidden_size, spec.num_kv_heads * spec.head_dim

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, dtype=torch.float32) * spec.init_std).contiguous()

    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(spec.vocab_size, h)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = normal(h, h)
        t[p + "self_attn.k_proj.weight"] = normal(kv, h)
        t[p + "self_attn.v_proj.weight"] = normal(kv, h)
        t[p + "self_attn.o_proj.weight"] = normal(h, h)
        t[p + "mlp.gate_proj.weight"] = normal(spec.intermediate_size, h)
        t[p + "mlp.up_proj.weight"] = normal(spec.intermediate_size, h)
        t[p + "mlp.down_proj.weight"] = normal(h, spec.intermediate_size)
        t[p + "input_layernorm.weight"] = torch.ones(h)
        t[p + "post_attention_layernorm.weight"] = torch.ones(h)
    t["model.norm.weight"] = torch.ones(h)
    t["lm_head.weight"] = normal(spec.vocab_size, h)
    return t


def _dump(obj: dict) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def build(out: Path, spec: TinyLlama | None = None) -> Path:
    """Write the model folder ``out`` (created; existing files of :data:`FILES` are replaced).

    Args:
        out: the folder vLLM is given as its model.
        spec: shape and seed (defaults when None).

    Returns:
        ``out``.

    Raises:
        ValueError: an inconsistent spec (:meth:`TinyLlama.validate`).
    """
    from safetensors.torch import save_file

    spec = spec or TinyLlama()
    spec.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(_dump(config_json(spec)))
    (out / "generation_config.json").write_text(_dump({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID}))
    save_file(weights(spec), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "tokenizer.json").write_text(tokenizer_json(spec) + "\n")
    (out / "tokenizer_config.json").write_text(_dump({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIALS[BOS_ID], "eos_token": SPECIALS[EOS_ID], "unk_token": SPECIALS[0],
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": spec.max_position_embeddings,
    }))
    return out


def file_digests(folder: Path) -> dict[str, str]:
    """sha256 of each of :data:`FILES` in ``folder`` (missing files are left out)."""
    return {name: hashlib.sha256((Path(folder) / name).read_bytes()).hexdigest()
            for name in FILES if (Path(folder) / name).is_file()}
