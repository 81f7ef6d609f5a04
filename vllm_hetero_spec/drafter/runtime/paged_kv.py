"""The drafter's own paged KV cache: a bounded pool of blocks and per-sequence tables.

The drafter cannot live in vLLM's KV groups: its tokenizer splits the same text into a
different number of tokens, so its positions, and with them its slot mapping, differ
from the target's, while vLLM gives every group the target's block table. So the
plugin keeps a pool of its own, in the layout the platform's attention backend reads,
and hands vLLM's backend a block table per step exactly as vLLM's runner does.

Blocks are reference-counted: :meth:`PagedCache.fork` shares every block, and a write
into a shared block first copies it (copy-on-write). That makes a fork O(1) -- the Ray
pipeline's speculative branches, and ``slrs``'s token trees, whose nodes are sequences
that share their ancestors' blocks -- and rollback just moves a length.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class PoolExhausted(RuntimeError):
    """The pool has no free block for a write; the request runs undrafted this step."""


class BlockPool:
    """A free list over ``num_blocks`` block ids with reference counts.

    ``copy_blocks(src, dst)`` copies whole blocks (every layer) when a shared block is
    written; the runtime that owns the KV tensors provides it.
    """

    def __init__(self, num_blocks: int, block_size: int, bytes_per_block: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        self._free = list(range(num_blocks - 1, -1, -1))
        self._refs = np.zeros(num_blocks, dtype=np.int32)
        self.copy_blocks: Callable[[list[int], list[int]], None] = _no_copy

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def used_bytes(self) -> int:
        return (self.num_blocks - len(self._free)) * self.bytes_per_block

    def take(self) -> int:
        if not self._free:
            raise PoolExhausted(f"draft KV pool full ({self.num_blocks} blocks of {self.block_size} tokens)")
        block = self._free.pop()
        self._refs[block] = 1
        return block

    def share(self, blocks: list[int]) -> None:
        self._refs[blocks] += 1

    def release(self, blocks: list[int]) -> None:
        for block in blocks:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free.append(block)

    def is_shared(self, block: int) -> bool:
        return bool(self._refs[block] > 1)


def _no_copy(src: list[int], dst: list[int]) -> None:
    raise RuntimeError("BlockPool.copy_blocks was not set by the runtime")


class PagedCache:
    """One sequence's block table and committed length in a :class:`BlockPool`.

    ``length`` tokens are cached; the runtime writes new tokens at ``length`` and then
    moves it (:meth:`advance`). Rolling back is :meth:`truncate`: the next write simply
    overwrites the rejected suffix, and its blocks stay with the sequence until
    :meth:`release`.
    """

    def __init__(self, pool: BlockPool, blocks: list[int] | None = None, length: int = 0):
        self.pool = pool
        self.blocks = blocks if blocks is not None else []
        self.length = length

    def reserve(self, end: int) -> None:
        """Make positions ``[length, end)`` writable: allocate missing blocks and
        un-share shared ones (copied through ``pool.copy_blocks``). Raises
        :class:`PoolExhausted` (having allocated nothing it keeps) when the pool runs out."""
        bs = self.pool.block_size
        first, last = self.length // bs, (end - 1) // bs
        copies: list[tuple[int, int]] = []
        taken: list[int] = []
        try:
            for idx in range(first, last + 1):
                if idx < len(self.blocks):
                    old = self.blocks[idx]
                    if self.pool.is_shared(old):
                        new = self.pool.take()
                        taken.append(new)
                        copies.append((old, new))
                else:
                    taken.append(self.pool.take())
        except PoolExhausted:
            self.pool.release(taken)
            raise
        it = iter(taken)
        for idx in range(first, last + 1):
            if idx < len(self.blocks):
                if self.pool.is_shared(self.blocks[idx]):
                    self.pool.release([self.blocks[idx]])
                    self.blocks[idx] = next(it)
            else:
                self.blocks.append(next(it))
        if copies:
            self.pool.copy_blocks([s for s, _ in copies], [d for _, d in copies])

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, length: int) -> None:
        """Roll back to ``length`` tokens (rejected or re-tokenized suffix)."""
        self.length = min(self.length, length)

    def fork(self) -> "PagedCache":
        """A sequence with the same cached tokens, sharing every block until written."""
        self.pool.share(self.blocks)
        return PagedCache(self.pool, list(self.blocks), self.length)

    def release(self) -> None:
        """Give the blocks back (idempotent)."""
        self.pool.release(self.blocks)
        self.blocks = []
        self.length = 0

    @property
    def nbytes(self) -> int:
        return len(self.blocks) * self.pool.bytes_per_block


class TokenTree:
    """Draft tokens branching from one cached context, evaluated level by level
    (``slrs``'s psi nodes, the pipeline's alternative bonus tokens).

    Every node is a sequence of its own that forks its parent (the context, or an
    earlier node), so siblings share their ancestors' blocks and only the block each
    new token lands in is copied. The context's cache is never written.
    """

    def __init__(self, root: PagedCache):
        self.root = root
        self.nodes: list[PagedCache] = []

    def grow(self, parents: list[int]) -> list[PagedCache]:
        """New nodes under ``parents`` (0: the context, j: node j - 1), not yet holding
        their token (the runtime's forward writes it)."""
        new = [(self.root if p == 0 else self.nodes[p - 1]).fork() for p in parents]
        self.nodes += new
        return new

    def release(self) -> None:
        for node in self.nodes:
            node.release()
        self.nodes = []
