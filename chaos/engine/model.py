"""The reference engine's model: a seeded random Llama run against a paged KV pool.

The weights live in small ``torch.nn`` modules of our own (:class:`LlamaWeights`) with the
parameter names, shapes and dtype of transformers' ``LlamaForCausalLM`` (``model.embed_tokens``,
``model.layers.{i}.self_attn.{q,k,v,o}_proj``, ``model.layers.{i}.mlp.{gate,up,down}_proj``,
``model.layers.{i}.{input,post_attention}_layernorm``, ``model.norm``, ``lm_head``; no biases),
filled from one seeded ``torch.Generator`` (no download). Their RMSNorm and SiLU-gated MLP
compute what transformers' ``LlamaRMSNorm`` and ``LlamaMLP`` compute, op for op, with
``LlamaConfig``'s defaults (``rms_norm_eps`` 1e-6, ``hidden_act`` "silu"); the rope base is
10000 (transformers' default ``rope_theta``). tests/engine/test_model_weights.py pins both
against transformers' own model, bit for bit. Not importing transformers saves each engine
process about 3 CPU-s of start-up. The forward pass is our own, using the modules' weights, so
that KV is read from and written to the paged pool directly::

    token ids ─> embed ─> [rmsnorm ─> q,k,v proj ─> rope ─> write k,v to slots ─> gather
                          k,v of positions [0, end) ─> causal attention ─> o proj ─> + ─>
                          rmsnorm ─> mlp ─> +] x layers ─> norm ─> lm_head (last row)

Bit-exact recompute equivalence: a CPU GEMM may round differently for a different number of
rows, so every prompt position is computed in a *canonical segment* (see
``chaos.engine.segments``) and every generated position by a one-row decode step. A position's
KV therefore has the same bits whether it was computed now, loaded from LMCache or reused from
the local prefix cache. Requests are never fused into one GEMM for the same reason.

Batch-dependent numerics (opt-in, ``--numerics batch-dependent``): GPU kernels that are not
batch-invariant round differently for different batch sizes, so the same prompt's KV and logits
move by a few ulps with the batch it ran in (vLLM's reproducibility docs; the reason for
``VLLM_BATCH_INVARIANT``). This mode adds, after every decoder layer, a deterministic
pseudo-random offset of relative size ``batch_noise`` (of the row's RMS) that is a function of
(position, channel, layer, batch size): a request computed in a batch of 3 gets other bits than
in a batch of 1, a cache hit reads KV computed in another batch than its recompute, and greedy
outputs flip only where the top-1/top-2 logits nearly tie. A wrong KV block, a wrong hit length
or stale blocks move logits by orders of magnitude more. With ``batch_key=None`` or
``batch_noise=0`` (the default) none of this code runs: the exact path is untouched.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from chaos.engine.kv_pool import KVPool


@dataclass(frozen=True)
class ModelSpec:
    """Shape of the seeded random Llama model.

    Attributes:
        num_layers: decoder layers.
        hidden_size: model width.
        num_heads: query heads; ``hidden_size % num_heads == 0``.
        num_kv_heads: KV heads (GQA); ``num_heads % num_kv_heads == 0``.
        intermediate_size: MLP width.
        vocab_size: embedding rows; at least the tokenizer's vocabulary (259).
        dtype: ``"float32"`` or ``"bfloat16"``.
        seed: ``torch.manual_seed`` value for the weights.
        init_std: std of the normal weight init. Larger than transformers' 0.02 default so
            that the output depends on the whole context (a model that ignores its context
            would hide wrong KV from the recompute-equivalence check).
        max_positions: rope table length (tokens).
    """

    num_layers: int = 4
    hidden_size: int = 512
    num_heads: int = 8
    num_kv_heads: int = 4
    intermediate_size: int = 1024
    vocab_size: int = 512
    dtype: str = "float32"
    seed: int = 0
    init_std: float = 0.08
    max_positions: int = 32768

    @property
    def head_size(self) -> int:
        """Per-head width (elements)."""
        return self.hidden_size // self.num_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype named by ``dtype``."""
        return {"float32": torch.float32, "bfloat16": torch.bfloat16}[self.dtype]

    def validate(self) -> None:
        """Check the shape constraints.

        Raises:
            ValueError: a size does not divide, or the dtype is unknown.
        """
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.vocab_size < 259:
            raise ValueError("vocab_size must be at least 259 (256 bytes + 3 specials)")

    def fingerprint(self, engine_version: str) -> str:
        """A short hash of everything that decides the output bits.

        Args:
            engine_version: the kvchaos version string.

        Returns:
            16 hex characters; equal fingerprints mean equal outputs for equal inputs.
        """
        blob = json.dumps({"spec": self.__dict__, "version": engine_version,
                           "torch": torch.__version__}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


#: transformers' ``LlamaConfig().rms_norm_eps`` (transformers 5.x configuration_llama.py).
RMS_NORM_EPS = 1e-6
#: transformers' default ``rope_theta`` for Llama (``LlamaConfig().rope_parameters``).
ROPE_THETA = 10000.0


class _Linear(nn.Module):
    """A bias-free linear layer: ``y = x @ weight.T``, ``weight`` ``[out_features, in_features]``.

    Computes ``torch.nn.functional.linear(x, weight, None)``, what ``nn.Linear(bias=False)``
    computes; its parameter is left uninitialised (:class:`LlamaWeights` fills it).
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class _Embedding(nn.Module):
    """Token embedding: ``weight[ids]``, ``weight`` ``[vocab_size, hidden_size]`` (uninitialised)."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    """transformers' ``LlamaRMSNorm``: RMS-normalise in float32, cast back, scale by ``weight``.

    Shapes: ``[..., hidden_size]`` in and out, same dtype as the input.
    """

    def __init__(self, hidden_size: int, eps: float = RMS_NORM_EPS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class MLP(nn.Module):
    """transformers' ``LlamaMLP`` with ``hidden_act="silu"``: ``down(silu(gate(x)) * up(x))``.

    Shapes: ``[..., hidden_size]`` in and out.
    """

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = _Linear(hidden_size, intermediate_size)
        self.up_proj = _Linear(hidden_size, intermediate_size)
        self.down_proj = _Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Attention(nn.Module):
    """The attention projections (the attention itself is :meth:`PagedLlama.forward`)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, kv = spec.hidden_size, spec.num_kv_heads * spec.head_size
        self.q_proj = _Linear(h, spec.num_heads * spec.head_size)
        self.k_proj = _Linear(h, kv)
        self.v_proj = _Linear(h, kv)
        self.o_proj = _Linear(spec.num_heads * spec.head_size, h)


class _DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.self_attn = _Attention(spec)
        self.mlp = MLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = RMSNorm(spec.hidden_size)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size)


class _Decoder(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.embed_tokens = _Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(_DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size)


class LlamaWeights(nn.Module):
    """The seeded random Llama's parameters, named as in transformers' ``LlamaForCausalLM``.

    ``model.embed_tokens.weight`` ``[vocab, hidden]``; per layer ``i``:
    ``model.layers.{i}.self_attn.{q,o}_proj.weight`` ``[hidden, hidden]``,
    ``{k,v}_proj.weight`` ``[kv_heads * head_size, hidden]``,
    ``mlp.{gate,up}_proj.weight`` ``[intermediate, hidden]``, ``mlp.down_proj.weight``
    ``[hidden, intermediate]``, ``{input,post_attention}_layernorm.weight`` ``[hidden]``;
    ``model.norm.weight`` ``[hidden]``; ``lm_head.weight`` ``[vocab, hidden]``.

    Values: in ``sorted(named_parameters())`` order, every ``*norm.weight`` is 1 and every other
    parameter is ``torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * init_std``
    (float32, the generator shared in that order), then the whole model is cast to
    ``spec.dtype``. This is the order and draw the engine has always used, so the weights (and
    the fingerprint) are unchanged from the transformers-built model.
    """

    def __init__(self, spec: ModelSpec) -> None:
        """Build and fill the parameters (float32 first, then cast to ``spec.dtype``).

        Args:
            spec: model shape and seed (validated by the caller).
        """
        super().__init__()
        self.model = _Decoder(spec)
        self.lm_head = _Linear(spec.hidden_size, spec.vocab_size)
        gen = torch.Generator().manual_seed(spec.seed)
        with torch.no_grad():
            for name, p in sorted(self.named_parameters()):
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * spec.init_std)
        self.to(spec.torch_dtype).eval()
        self.requires_grad_(False)


class PagedLlama:
    """A seeded random Llama whose attention reads and writes a ``KVPool``."""

    def __init__(self, spec: ModelSpec) -> None:
        """Build the model (seeded, no download).

        Args:
            spec: model shape.

        Raises:
            ValueError: invalid ``spec``.
        """
        spec.validate()
        self.spec = spec
        model = LlamaWeights(spec)
        self.model = model
        #: Relative size of the batch-dependent offset per layer (0: exact numerics).
        self.batch_noise = 0.0
        self._layers = model.model.layers
        self._scale = spec.head_size ** -0.5
        inv_freq = 1.0 / ROPE_THETA ** (
            torch.arange(0, spec.head_size, 2, dtype=torch.float32) / spec.head_size)
        self._inv_freq = inv_freq

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * self._inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        dt = self.spec.torch_dtype
        return emb.cos().to(dt), emb.sin().to(dt)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]

    def _batch_offset(self, x: torch.Tensor, start: int, layer: int, batch_key: int) -> torch.Tensor:
        """The batch-dependent offset of one layer's output rows (see the module doc).

        A classic shader hash, ``fract(sin(dot) * 43758.5453)``, in float64: uniform in [-1, 1),
        a pure function of (absolute position, channel, layer, batch key), independent of how
        the prompt was split into segments. Scaled by ``batch_noise`` times each row's RMS.
        """
        pos = torch.arange(start, start + x.shape[0], dtype=torch.float64)[:, None]
        ch = torch.arange(x.shape[-1], dtype=torch.float64)[None, :]
        h = torch.sin(pos * 12.9898 + ch * 78.233 + layer * 4.1414 + batch_key * 2.7183) * 43758.5453
        u = (h - torch.floor(h)) * 2.0 - 1.0
        rms = x.double().pow(2).mean(-1, keepdim=True).sqrt()
        return (u * rms * self.batch_noise).to(x.dtype)

    @torch.inference_mode()
    def forward(self, token_ids: list[int], start: int, block_table: list[int],
                pool: KVPool, batch_key: int | None = None) -> torch.Tensor:
        """Compute positions ``[start, start + len(token_ids))`` of one request.

        Writes their K and V into the request's blocks and attends over positions
        ``[0, end)`` read back from the pool (so earlier positions may have been computed,
        loaded from LMCache or shared from the prefix cache).

        Args:
            token_ids: the tokens at those positions (T >= 1).
            start: absolute position of ``token_ids[0]``.
            block_table: the request's block ids; must cover positions ``[0, end)``.
            pool: the paged KV pool.
            batch_key: the batch this ran in (requests in the scheduler step); only read when
                ``batch_noise`` is set (batch-dependent numerics).

        Returns:
            float32 logits of the last position, shape ``[vocab_size]``.

        Raises:
            IndexError: the block table does not cover ``end`` positions.
        """
        T = len(token_ids)
        end = start + T
        spec = self.spec
        nh, nkv, hd = spec.num_heads, spec.num_kv_heads, spec.head_size
        bs = pool.block_size
        if len(block_table) * bs < end:
            raise IndexError(f"block table covers {len(block_table) * bs} < {end} positions")
        table = torch.tensor(block_table, dtype=torch.long)
        all_pos = torch.arange(end)
        slots_all = table[all_pos // bs] * bs + all_pos % bs
        new_slots = slots_all[start:]
        cos, sin = self._rope(all_pos[start:])
        # Causal mask of the segment's rows over keys [0, end).
        mask = torch.arange(end)[None, :] > (start + torch.arange(T))[:, None]
        x = self.model.model.embed_tokens(torch.tensor(token_ids, dtype=torch.long))
        for li, layer in enumerate(self._layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(T, nh, hd)
            k = attn.k_proj(h).view(T, nkv, hd)
            v = attn.v_proj(h).view(T, nkv, hd)
            q = self._rotate(q, cos, sin)
            k = self._rotate(k, cos, sin)
            flat = pool.layer_flat(li)  # [2, slots, nkv, hd]
            flat[0].index_copy_(0, new_slots, k)
            flat[1].index_copy_(0, new_slots, v)
            keys = flat[0].index_select(0, slots_all)  # [end, nkv, hd]
            values = flat[1].index_select(0, slots_all)
            group = nh // nkv
            keys = keys.permute(1, 0, 2).repeat_interleave(group, dim=0)  # [nh, end, hd]
            values = values.permute(1, 0, 2).repeat_interleave(group, dim=0)
            qh = q.permute(1, 0, 2)  # [nh, T, hd]
            scores = torch.matmul(qh, keys.transpose(1, 2)).float() * self._scale
            scores.masked_fill_(mask[None], float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(values.dtype)
            out = torch.matmul(probs, values).permute(1, 0, 2).reshape(T, nh * hd)
            x = x + attn.o_proj(out)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if self.batch_noise and batch_key is not None:
                x = x + self._batch_offset(x, start, li, batch_key)
        last = self.model.model.norm(x[-1:])
        return self.model.lm_head(last)[0].float()
