"""Per-node chunk caches for the routing simulation: LRU sets of chunk hashes, plus an N-node index.

* each serving node's KV cache is a :class:`kvcli.store.lru.ChunkLru` (the one LRU over chunks, shared with the
  replay's capacity limit): chunk hashes in LRU order, at most ``capacity_tokens // chunk_size`` chunks.
* :class:`ChunkIndex` holds N such caches and a hash -> node-bitmask map (bit ``n`` set when node ``n`` holds the
  chunk), so every node's prefix match comes out of one walk over the request's chunks.

Complexity (per request of ``c`` chunks, ``N`` nodes): ``match``/``depth`` O(c) dict lookups; ``store`` O(c + e)
for ``e`` evictions (amortized O(1) each); ``depths`` O(c + N) big-int bit operations, stopping at the first chunk
no node holds. Depths are counted in chunks (multiply by ``chunk_size`` for tokens); ``depths`` returns ``[nodes]``.
"""
from __future__ import annotations

from kvcli.store.lru import ChunkLru


class ChunkIndex:
    """N LRU chunk caches plus a hash -> node-bitmask map, so all nodes' prefix matches cost one walk."""

    def __init__(self, nodes: int, capacity_chunks: int | None) -> None:
        self.caches = [ChunkLru(capacity_chunks) for _ in range(nodes)]
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
        """:meth:`ChunkLru.store` on ``node``, keeping the bitmasks in step. Returns (new, evicted)."""
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
