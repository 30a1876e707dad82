"""Per-node chunk caches for the routing simulation: LRU sets of chunk hashes, plus an N-node index.

* :class:`LruChunkCache` is one serving node's KV cache, modelled at chunk granularity: chunk hashes (16-byte
  prefix-chained hashes from :mod:`kvcli.hashing`, one per full chunk) in LRU order, at most ``capacity`` chunks
  (capacity in chunks, i.e. ``capacity_tokens // chunk_size``; None = unlimited). No KV data is held.
* :class:`ChunkIndex` holds N such caches and a hash -> node-bitmask map (bit ``n`` set when node ``n`` holds the
  chunk), so every node's prefix match comes out of one walk over the request's chunks.

Complexity (per request of ``c`` chunks, ``N`` nodes): ``match``/``depth`` O(c) dict lookups; ``store`` O(c + e)
for ``e`` evictions (amortized O(1) each); ``depths`` O(c + N) big-int bit operations, stopping at the first chunk
no node holds. Depths are counted in chunks (multiply by ``chunk_size`` for tokens); ``depths`` returns ``[nodes]``.
"""
from __future__ import annotations

from collections import OrderedDict


class LruChunkCache:
    """One node's KV cache: chunk hashes in LRU order, at most ``capacity`` chunks (None = unlimited)."""

    __slots__ = ("capacity", "_lru")

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self._lru: OrderedDict[bytes, None] = OrderedDict()

    def __contains__(self, chunk_hash: bytes) -> bool:
        return chunk_hash in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, hashes) -> int:
        """Chunks of the longest run of ``hashes`` cached from chunk 0 (read-only: the LRU order is unchanged)."""
        lru, k = self._lru, 0
        for h in hashes:
            if h not in lru:
                break
            k += 1
        return k

    def store(self, hashes) -> tuple[list[bytes], list[bytes]]:
        """Cache ``hashes`` (a request's chunks, in prompt order) as most recent; evict least recent to capacity.

        Chunks are touched last-to-first, so chunk 0 is the most recent and a request's tail is evicted before its
        head (as vLLM frees blocks in reverse order): an eviction never leaves a hole in front of a kept chunk.

        Returns:
            (newly cached hashes, evicted hashes), each in the order it happened.
        """
        lru, new = self._lru, []
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                new.append(h)
        evicted = []
        if self.capacity is not None:
            while len(lru) > self.capacity:
                evicted.append(lru.popitem(last=False)[0])
        return new, evicted


class ChunkIndex:
    """N LRU chunk caches plus a hash -> node-bitmask map, so all nodes' prefix matches cost one walk."""

    def __init__(self, nodes: int, capacity_chunks: int | None) -> None:
        self.caches = [LruChunkCache(capacity_chunks) for _ in range(nodes)]
        self._mask: dict[bytes, int] = {}
        self._all = (1 << nodes) - 1

    def depth(self, node: int, hashes) -> int:
        """Leading chunks of ``hashes`` cached on ``node``."""
        return self.caches[node].match(hashes)

    def depths(self, hashes) -> list[int]:
        """Leading chunks of ``hashes`` cached on each node, ``[nodes]``; one pass over the chunks."""
        depths = [0] * len(self.caches)
        alive, mask = self._all, self._mask
        for i, h in enumerate(hashes):
            kept = mask.get(h, 0) & alive
            dropped, alive = alive & ~kept, kept
            while dropped:
                low = dropped & -dropped
                depths[low.bit_length() - 1] = i
                dropped ^= low
            if not alive:
                return depths
        while alive:
            low = alive & -alive
            depths[low.bit_length() - 1] = len(hashes)
            alive ^= low
        return depths

    def store(self, node: int, hashes) -> tuple[list[bytes], list[bytes]]:
        """:meth:`LruChunkCache.store` on ``node``, keeping the bitmasks in step. Returns (new, evicted)."""
        new, evicted = self.caches[node].store(hashes)
        bit, mask = 1 << node, self._mask
        for h in new:
            mask[h] = mask.get(h, 0) | bit
        for h in evicted:
            left = mask[h] & ~bit
            if left:
                mask[h] = left
            else:
                del mask[h]
        return new, evicted
