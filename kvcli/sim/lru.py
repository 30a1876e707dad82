"""The one LRU over chunks, used by the replay's capacity limit, the routing simulation's node caches and the
capacity curve: chunk hashes in recency order, at most ``capacity`` chunks (None: unlimited). No KV data is held.
A chunk is named by its hash (bytes) or by any other hashable that stands for it one-to-one (the routing
simulation uses small int ids, which hash and compare faster).

Order rule (the prefix must outlive its extensions): after a request, its chunks are ordered most recent = chunk 0
... least recent = its last chunk. :meth:`ChunkLru.store` touches a request's chunks last-to-first, so eviction
takes a chain's tail before its head (as vLLM frees a request's blocks in reverse order) and never leaves a hole in
front of a kept chunk. Because the order does not depend on the capacity, the resident sets at two capacities are
nested (Mattson's inclusion property), which is what makes a one-pass hit curve over all capacities exact.

Until the first eviction the order is not needed yet: the chunks held are a plain ``set`` (one C-level
``update`` per request: about a quarter of the time of the ``dict.fromkeys`` + ``dict.update`` it replaced, and a
small part of the ``OrderedDict`` moves and insertions it defers) and the requests' chunk sequences are logged; the
first time the capacity is exceeded, or once the log holds more than ``LOG_FACTOR * capacity + LOG_SLACK`` chunks
(so it stays O(capacity) in memory), the order is built from the log into the ``OrderedDict`` kept from then on:
the same order as if it had been kept all along. Built in C, not touch by touch: replaying touches last-to-first
leaves the chunks ordered by their last appearance in the log read that way, which is the order of first
appearance in the log read backwards (requests last-to-first, each chunk 0 first), reversed. Without a capacity
nothing is ever evicted, so nothing is logged. (The routing simulation on the Mooncake sample, 3M-token caches,
rarely evicts: its LRU time is then a fraction.)

Complexity: ``match`` O(c) hash lookups for a request of ``c`` chunks; ``store`` and ``touch`` O(c + e) for ``e``
evictions, amortized (the replay costs what the logged touches would have cost).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import chain, islice

LOG_FACTOR, LOG_SLACK = 4, 4096  # logged chunks before the order is built without an eviction


class ChunkLru:
    """Chunk hashes (bytes, or ids: see the module docstring) in LRU order, at most ``capacity`` chunks (None:
    unlimited). Not thread-safe."""

    __slots__ = ("capacity", "_order", "_log", "_logged")

    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be >= 0 chunks, got {capacity}")
        self.capacity = capacity
        # The chunks held: a set (no order) while nothing was evicted, then an OrderedDict, least recent first.
        self._order: set[bytes] | OrderedDict[bytes, None] = set()
        self._log: list[Sequence[bytes]] = []  # touches not in _order's order yet (while it is a set)
        self._logged = 0  # chunks in _log

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
        if len(self._order) + len(evicted) - before != len(new):  # a new chunk given twice: once in ``new``
            new = list(dict.fromkeys(new))
        return new, evicted

    def touch(self, hashes: Sequence[bytes]) -> list[bytes]:
        """:meth:`store` without naming the new chunks (the routing simulation's caches need only the evictions:
        about a quarter faster on the Mooncake sample). Returns the hashes evicted, least recent first."""
        order = self._order
        if type(order) is set:  # nothing evicted yet: the order can wait (module docstring)
            order.update(hashes)
            if self.capacity is None:
                return []
            self._log.append(hashes if type(hashes) is tuple else tuple(hashes))
            self._logged += len(hashes)
            if len(order) <= self.capacity and self._logged <= LOG_FACTOR * self.capacity + LOG_SLACK:
                return []
            order = self._ordered()
        else:
            move_to_end = order.move_to_end  # type: ignore[union-attr]  # an OrderedDict once not a set
            for h in reversed(hashes):
                if h in order:
                    move_to_end(h)
                else:
                    order[h] = None  # type: ignore[index]
        excess = 0 if self.capacity is None else len(order) - self.capacity
        if excess <= 0:
            return []
        evicted = list(islice(order, excess))  # the least recent, oldest first
        for h in evicted:
            del order[h]  # type: ignore[union-attr]  # an OrderedDict: built before anything is evicted
        return evicted

    def _ordered(self) -> OrderedDict:
        """The held chunks in LRU order, as if the logged touches were replayed (each last chunk first, as
        :meth:`touch` orders them), into the OrderedDict kept from now on: first appearances in the log read
        backwards, reversed (module docstring). Every held chunk is in the log (all touches are logged)."""
        latest_first = list(dict.fromkeys(chain.from_iterable(reversed(self._log))))
        latest_first.reverse()
        order = OrderedDict.fromkeys(latest_first)
        self._order, self._log, self._logged = order, [], 0
        return order

    def forget(self, hashes: Sequence[bytes]) -> None:
        """Forget chunks of an unlimited cache (capacity None): one C-level set difference. The routing simulation's
        node caches use it to drop the chunks that an LRU of their capacity, fed the same requests, evicted
        (:meth:`kvcli.route.policies.Policy.mirror_nodes`). Raises ValueError on a limited cache."""
        if self.capacity is not None:
            raise ValueError("forget() is for an unlimited cache; a limited one evicts by itself")
        self._order.difference_update(hashes)  # type: ignore[union-attr]  # unlimited: always the set

    def discard(self, chunk_hash: bytes) -> None:
        """Forget a chunk (it left the cache some other way, e.g. expiry)."""
        order = self._order
        if type(order) is set:
            if self.capacity is None:
                order.discard(chunk_hash)
                return
            order = self._ordered()  # a logged touch would bring it back
        order.pop(chunk_hash, None)  # type: ignore[call-arg]  # an OrderedDict here
