"""vLLM's block pool and prefix cache: the free queue, the null block, and which cached block an allocation evicts.

The rules, as vLLM 0.32.0 keeps them (``vllm/v1/core/block_pool.py``: ``BlockPool``; the queue is
``FreeKVCacheBlockQueue`` in ``vllm/v1/core/kv_cache_utils.py``):

* The pool has ``num_gpu_blocks`` blocks, ids ``0 .. N - 1``. Block 0 is the **null block**, taken out of the free
  queue when the pool is built and never handed to a request, so ``N - 1`` blocks hold KV.
* The **free queue** starts as blocks ``1 .. N - 1`` in id order. :meth:`BlockPool.allocate` takes blocks from its
  head; a block taken that is cached loses its key then. That is the only eviction: a cached block stays a hit
  while it waits in the queue.
* A block is **cached** (:meth:`BlockPool.cache`) under the key of the full block of tokens it holds; keys are not
  de-duplicated, so two blocks can hold one key (a request that recomputes a cached block). A lookup
  (:meth:`BlockPool.cached_run`) takes, per key, the earliest cached block that still holds it.
* A hit block is **touched** (:meth:`BlockPool.touch`): its reference count goes up, and a block with no other
  reference leaves the free queue, so a running request's blocks are never evicted.
* :meth:`BlockPool.free` releases a request's blocks last block first (``free`` in
  ``single_type_kv_cache_manager.py``); each one left without a reference goes back to the queue: a cached block
  at the tail, so the blocks of one request are evicted tail first and after every block freed before them; an
  uncached one (the partial last block) at the head, to be taken first. The queue therefore always holds the
  uncached blocks ahead of the cached ones, which sit in least recently freed order.

Keys are any hashables that stand for a block's content and its whole prefix one-to-one (kvcli's chained chunk
hashes, salt included, as vLLM chains its block hashes). The pool holds no KV and no tokens.

Cost: O(1) per block allocated, touched, cached or freed (an ordered dict is the queue).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

NULL_BLOCK = 0  # the block id vLLM reserves as its null block


class BlockPool:
    """vLLM's block pool and prefix cache of ``num_gpu_blocks`` blocks (module docstring). Source: ``BlockPool``
    and ``FreeKVCacheBlockQueue`` in ``vllm/v1/core/block_pool.py`` and ``kv_cache_utils.py``, vLLM 0.32.0.

    Args:
        num_gpu_blocks: the engine's ``num_gpu_blocks`` (``num_gpu_blocks_override``, or the ``num_gpu_blocks``
            label of its ``vllm:cache_config_info`` metric), null block included.

    Attributes:
        stored, evicted: blocks cached and cached blocks evicted so far: the blocks of vLLM's ``BlockStored`` and
            ``BlockRemoved`` KV events.

    Raises:
        ValueError: ``num_gpu_blocks`` < 1.
    """

    def __init__(self, num_gpu_blocks: int) -> None:
        if num_gpu_blocks < 1:
            raise ValueError(f"the pool needs at least 1 block (its null block), got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_gpu_blocks))  # head: taken first
        self._refs = [0] * num_gpu_blocks
        self._key: dict[int, Hashable] = {}  # block -> the key it is cached under
        self._blocks: dict[Hashable, dict[int, None]] = {}  # key -> its blocks, earliest cached first
        self.stored = self.evicted = 0

    @property
    def free_blocks(self) -> int:
        """Blocks in the free queue (cached ones included): what an allocation may take."""
        return len(self._free)

    @property
    def cached_blocks(self) -> int:
        """Blocks that hold a key, in the free queue or held by a request."""
        return len(self._key)

    def __contains__(self, key: Hashable) -> bool:
        """Whether some block holds ``key``."""
        return key in self._blocks

    def cached_run(self, keys: Sequence[Hashable]) -> list[int]:
        """The blocks of the longest run of ``keys`` cached from key 0, one per key (the earliest cached block of
        each). Read-only: nothing is touched."""
        run = []
        for key in keys:
            blocks = self._blocks.get(key)
            if blocks is None:
                break
            run.append(next(iter(blocks)))
        return run

    def evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` wait in the free queue: touching them takes them out of it, so they count
        against the free blocks an allocation needs (vLLM's ``_get_num_evictable_blocks``)."""
        return sum(1 for b in blocks if self._refs[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """A request takes ``blocks`` as hits: each one's reference count goes up; one that had none leaves the
        free queue."""
        for b in blocks:
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1

    def allocate(self, count: int) -> list[int]:
        """Take ``count`` blocks from the head of the free queue for a request; a cached one loses its key (the
        eviction).

        Raises:
            ValueError: fewer than ``count`` free blocks (vLLM's ``get_new_blocks`` raises too; its scheduler
                checks :attr:`free_blocks` first).
        """
        if count > len(self._free):
            raise ValueError(f"cannot take {count} blocks from a free queue of {len(self._free)}")
        taken = []
        for _ in range(count):
            b, _none = self._free.popitem(last=False)
            self._evict(b)
            self._refs[b] = 1
            taken.append(b)
        return taken

    def cache(self, block: int, key: Hashable) -> None:
        """Cache ``block`` (held by a request, its tokens full) under ``key``, beside any other block holding it.
        A block already cached keeps its key."""
        if block in self._key:
            return
        self._key[block] = key
        self._blocks.setdefault(key, {})[block] = None
        self.stored += 1

    def free(self, blocks: Sequence[int]) -> None:
        """Release a request's ``blocks`` (in its order: block 0 first), last block first: each one left without a
        reference goes to the queue's tail if cached, else to its head (module docstring)."""
        first: list[int] = []
        last: list[int] = []
        for b in reversed(blocks):
            if b == NULL_BLOCK:
                continue
            self._refs[b] -= 1
            if self._refs[b] == 0:
                (last if b in self._key else first).append(b)
        for b in reversed(first):  # at the head, in the order freed
            self._free[b] = None
            self._free.move_to_end(b, last=False)
        for b in last:
            self._free[b] = None

    def queue(self) -> list[int]:
        """The free queue, head first (for tests and reports)."""
        return list(self._free)

    def key_of(self, block: int) -> Hashable | None:
        """The key ``block`` is cached under (None: it holds none)."""
        return self._key.get(block)

    def _evict(self, block: int) -> None:
        key = self._key.pop(block, None)
        if key is None:
            return
        holders = self._blocks[key]
        del holders[block]
        if not holders:
            del self._blocks[key]
        self.evicted += 1
