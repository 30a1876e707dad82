"""The serving nodes' KV caches in the routing simulation: one :class:`kvcli.sim.lru.ChunkLru` per node (the one
LRU over chunks, shared with the replay's capacity limit), chunk ids (:attr:`SimRequest.chunk_ids`) in LRU order, at
most ``capacity_tokens // chunk_size`` chunks each. The router-side policies (``prefix``, ``cache-aware``, ``cost``)
keep one, fed by their own decisions; the nodes' real caches are the same LRUs, one per node, in
:mod:`kvcli.route.engine` (or, for those policies, unlimited ones that replay this index's evictions:
:meth:`kvcli.route.policies.Policy.mirror_nodes`).

Complexity (per request of ``c`` chunks, ``N`` nodes, ``k`` leading chunks held): ``depth`` O(k + 1) dict lookups;
``depths`` O(N + sum of the k's), a node that lacks chunk 0 costs one lookup; ``store``/``touch`` O(c + e) for
``e`` evictions. Depths are counted in chunks (multiply by ``chunk_size`` for tokens); ``depths`` returns ``[nodes]``.
(A hash -> node-bitmask map would make ``depths`` one walk for all nodes, but keeping it costs two more dict
updates per stored and evicted chunk: more than it saves, measured from 4 to 64 nodes.)
"""
from __future__ import annotations

from kvcli.sim.lru import ChunkLru


class ChunkIndex:
    """N LRU chunk caches, one per node: which node holds how much of a request's prefix."""

    def __init__(self, nodes: int, capacity_chunks: int | None) -> None:
        self.caches = [ChunkLru(capacity_chunks) for _ in range(nodes)]
        self._matches = [cache.match for cache in self.caches]
        self.touches = [cache.touch for cache in self.caches]  # per node, its cache's ChunkLru.touch

    def depth(self, node: int, chunk_ids) -> int:
        """Leading chunks of ``chunk_ids`` (a request's, in prompt order) cached on ``node``."""
        return self.caches[node].match(chunk_ids)

    def depths(self, chunk_ids) -> list[int]:
        """Leading chunks of ``chunk_ids`` cached on each node, ``[nodes]``."""
        return [match(chunk_ids) for match in self._matches]

    def store(self, node: int, chunk_ids) -> tuple[list, list]:
        """:meth:`ChunkLru.store` on ``node``. Returns (new, evicted) chunk ids."""
        return self.caches[node].store(chunk_ids)

    def touch(self, node: int, chunk_ids) -> list:
        """:meth:`ChunkLru.touch` on ``node`` (:meth:`store` without the new ids). Returns the evicted ids."""
        return self.touches[node](chunk_ids)
