"""The one LRU over chunks, used by the replay's capacity limit, the routing simulation's node caches and the
capacity curve: chunk hashes in recency order, at most ``capacity`` chunks (None: unlimited). No KV data is held.
A chunk is named by its hash (bytes) or by any other hashable that stands for it one-to-one (the routing
simulation uses small int ids, which hash and compare faster).

Order rule (the prefix must outlive its extensions): after a request, its chunks are ordered most recent = chunk 0
... least recent = its last chunk. :meth:`ChunkLru.store` touches a request's chunks last-to-first, so eviction
takes a chain's tail before its head (as vLLM frees a request's blocks in reverse order) and never leaves a hole in
front of a kept chunk. Because the order does not depend on the capacity, the resident sets at two capacities are
nested (Mattson's inclusion property), which is what makes a one-pass hit curve over all capacities exact.

Complexity: ``match`` O(c) dict lookups for a request of ``c`` chunks; ``store`` and ``touch`` O(c + e) for ``e``
evictions.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice


class ChunkLru:
    """Chunk hashes (bytes, or ids: see the module docstring) in LRU order, at most ``capacity`` chunks (None:
    unlimited). Not thread-safe."""

    __slots__ = ("capacity", "_order")

    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be >= 0 chunks, got {capacity}")
        self.capacity = capacity
        self._order: OrderedDict[bytes, None] = OrderedDict()  # least recent first

    def __contains__(self, chunk_hash: bytes) -> bool:
        return chunk_hash in self._order

    def __len__(self) -> int:
        return len(self._order)

    def match(self, hashes: Sequence[bytes]) -> int:
        """Chunks of the longest run of ``hashes`` held from chunk 0 (read-only: the order is unchanged)."""
        order, k = self._order, 0
        for h in hashes:
            if h not in order:
                break
            k += 1
        return k

    def store(self, hashes: Sequence[bytes]) -> tuple[list[bytes], list[bytes]]:
        """Make a request's chunks (``hashes``, in prompt order) the most recent, chunk 0 first; evict to capacity.

        Returns:
            ``(new, evicted)``: hashes not held before, in the order they were put in (last chunk first), and hashes
            evicted, least recent first. A new chunk of a request longer than the capacity can be in both (it was
            never kept).
        """
        order = self._order
        new = [h for h in reversed(hashes) if h not in order]
        before = len(order)
        evicted = self.touch(hashes)
        if len(order) + len(evicted) - before != len(new):  # a new chunk given twice: once in ``new``
            new = list(dict.fromkeys(new))
        return new, evicted

    def touch(self, hashes: Sequence[bytes]) -> list[bytes]:
        """:meth:`store` without naming the new chunks (the routing simulation's caches need only the evictions:
        about a quarter faster on the Mooncake sample). Returns the hashes evicted, least recent first."""
        order = self._order
        move_to_end = order.move_to_end
        for h in reversed(hashes):
            if h in order:
                move_to_end(h)
            else:
                order[h] = None
        excess = 0 if self.capacity is None else len(order) - self.capacity
        if excess <= 0:
            return []
        evicted = list(islice(order, excess))  # the least recent, oldest first
        for h in evicted:
            del order[h]
        return evicted

    def discard(self, chunk_hash: bytes) -> None:
        """Forget a chunk (it left the cache some other way, e.g. expiry)."""
        self._order.pop(chunk_hash, None)
