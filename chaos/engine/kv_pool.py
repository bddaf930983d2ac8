"""The paged KV pool: one tensor per layer in vLLM's layout.

Per layer ``[2, num_blocks, block_size, num_kv_heads, head_size]`` (K then V; vLLM's
FlashAttention layout, LMCache layout hint ``kv_layout=NHD``), allocated once, so LMCache's
worker adapter stores from and retrieves into the engine's blocks directly.
"""

from __future__ import annotations

import torch


class KVPool:
    """Fixed-size paged KV storage (no bookkeeping: see ``BlockManager``)."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_size: int, dtype: torch.dtype) -> None:
        """Allocate the pool (zeros).

        Args:
            num_layers: decoder layers.
            num_blocks: blocks per layer.
            block_size: tokens per block.
            num_kv_heads: KV heads.
            head_size: elements per head.
            dtype: element type.
        """
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layers = [
            torch.zeros(2, num_blocks, block_size, num_kv_heads, head_size, dtype=dtype)
            for _ in range(num_layers)
        ]

    def layer_flat(self, layer: int) -> torch.Tensor:
        """A view of one layer as ``[2, num_blocks * block_size, num_kv_heads, head_size]``."""
        t = self.layers[layer]
        return t.view(2, t.shape[1] * t.shape[2], t.shape[3], t.shape[4])

    def as_named(self) -> dict[str, torch.Tensor]:
        """The per-layer tensors keyed ``model.layers.<i>.self_attn`` (as vLLM names them)."""
        return {f"model.layers.{i}.self_attn": t for i, t in enumerate(self.layers)}

    def bytes_per_token(self) -> int:
        """KV bytes one token occupies across all layers."""
        t = self.layers[0]
        return 2 * t.shape[3] * t.shape[4] * t.element_size() * len(self.layers)
