"""Block bookkeeping for the paged KV pool, with the engine's own prefix cache (APC).

Like vLLM's KV cache manager: free blocks sit in an LRU queue (freed ones at the tail,
allocation from the head), a block keeps its prefix hash while free so a later request can
reuse it, and allocating a free block with a hash evicts that hash. Hashes chain over the
block's tokens and the cache salt (vLLM's ``hash_block_tokens`` shape, not its values).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


def block_hashes(token_ids: list[int], block_size: int, num_blocks: int,
                 salt: str | None) -> list[Hashable]:
    """Chained hashes of the first ``num_blocks`` full blocks of ``token_ids``.

    Args:
        token_ids: the request's tokens.
        block_size: tokens per block.
        num_blocks: how many leading full blocks to hash.
        salt: the request's cache salt (part of every hash), or None.

    Returns:
        one hash per block; equal only for equal token prefixes and salts.
    """
    out: list[Hashable] = []
    parent: Hashable = ("root", salt or "")
    for i in range(num_blocks):
        h = hash((parent, tuple(token_ids[i * block_size:(i + 1) * block_size])))
        out.append(h)
        parent = h
    return out


class BlockManager:
    """Reference counts, the free LRU queue and the prefix-cache hash map."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        """Create the bookkeeping for a pool of ``num_blocks`` blocks.

        Args:
            num_blocks: blocks in the pool.
            block_size: tokens per block.
            enable_prefix_caching: keep and reuse block hashes (the engine's APC).
        """
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.hash_of: dict[int, Hashable] = {}
        self.block_of: dict[Hashable, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks not referenced by any request (cached ones included)."""
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        """Blocks referenced by at least one request."""
        return self.num_blocks - len(self.free_queue)

    @property
    def num_cached(self) -> int:
        """Blocks that carry a prefix-cache hash (in use or free)."""
        return len(self.hash_of)

    def usage(self) -> float:
        """Fraction of blocks in use, 0..1 (vLLM's ``kv_cache_usage_perc``)."""
        return self.num_used / self.num_blocks

    def _take(self, block: int) -> None:
        self.free_queue.pop(block, None)
        h = self.hash_of.pop(block, None)
        if h is not None and self.block_of.get(h) == block:
            del self.block_of[h]
        self.ref_count[block] = 1

    def allocate(self, n: int) -> list[int] | None:
        """Take ``n`` blocks from the head of the free queue.

        Args:
            n: blocks wanted (>= 0).

        Returns:
            the block ids, or None (nothing taken) when fewer than ``n`` are free.
        """
        if n > len(self.free_queue):
            return None
        out = []
        for _ in range(n):
            block = next(iter(self.free_queue))
            self._take(block)
            out.append(block)
        return out

    def allocate_specific(self, wanted: list[int]) -> list[int] | None:
        """Take the given block ids where free, fresh blocks where not.

        Used only by the planted ``stale-blocks-on-resume`` bug.

        Returns:
            block ids (same length as ``wanted``), or None when not enough are free.
        """
        if len(wanted) > len(self.free_queue):
            return None
        out: list[int] = []
        for b in wanted:
            if b in self.free_queue:
                self._take(b)
                out.append(b)
        fresh = self.allocate(len(wanted) - len(out))
        assert fresh is not None
        # Keep the wanted ids in their old positions where we got them.
        result, it = [], iter(fresh)
        got = set(out)
        for b in wanted:
            result.append(b if b in got else next(it))
        return result

    def match_prefix(self, hashes: list[Hashable]) -> list[int]:
        """Find and take (ref +1) the longest run of cached blocks for ``hashes``.

        Args:
            hashes: the request's chained block hashes.

        Returns:
            the hit blocks, in order (empty without prefix caching).
        """
        if not self.enable_prefix_caching:
            return []
        hit: list[int] = []
        for h in hashes:
            b = self.block_of.get(h)
            if b is None:
                break
            hit.append(b)
        for b in hit:
            if self.ref_count[b] == 0:
                self.free_queue.pop(b, None)
            self.ref_count[b] += 1
        return hit

    def register(self, block: int, h: Hashable) -> None:
        """Record that ``block`` holds the KV of the prefix hashed ``h``."""
        if not self.enable_prefix_caching or h in self.block_of or block in self.hash_of:
            return
        self.hash_of[block] = h
        self.block_of[h] = block

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block; unreferenced blocks go to the free tail.

        Freed in reverse so that a request's tail blocks are evicted first (as vLLM does).
        """
        for b in reversed(blocks):
            self.ref_count[b] -= 1
            if self.ref_count[b] < 0:
                raise RuntimeError(f"block {b} freed twice")
            if self.ref_count[b] == 0:
                self.free_queue[b] = None

    def reset_prefix_cache(self) -> None:
        """Forget every hash (blocks in use keep their KV; nothing is freed)."""
        self.hash_of.clear()
        self.block_of.clear()
