"""Chunk ids: the distinct chunk hashes of one prepared trace, numbered 0, 1, 2... in order of first appearance.

The simulated caches (:mod:`kvcli.route.nodecache`, the engine's node caches) hold these ids, not the 16-byte
hashes: equal hashes get equal ids, so every hit and eviction is the same, but a small int hashes to itself, so
ids that arrive close in time sit close in the caches' hash tables. On the Mooncake sample that makes the LRU work
~25 % cheaper at chunk size 512 and ~3x cheaper at chunk size 16 (3M-token caches of 187,500 chunks; figures in
docs/measurements.md). The hashes are kept once each (:attr:`ChunkNumbering.hashes`), for the Redis cache manager.

Cost: one dict operation per chunk while a trace is prepared (about as much as hashing the chunk), and the dict of
all distinct hashes until :meth:`ChunkNumbering.close`.

Two dense-id schemes, because their callers differ: :class:`kvcli.sim.chunkids.ChunkIds` (the curves') returns a
whole request's ids as a numpy array, for per-chunk numpy state, at 24-48 bytes per chunk; these caches hash
Python ints, which this dict hands out faster than that table's arrays convert (on the Mooncake sample it took
about 1.4 times as long at chunk size 16, several times as long at 512), in prompt order, with each id's hash kept.
"""
from __future__ import annotations


class ChunkNumbering:
    """One trace's chunk ids. :meth:`number` while preparing it, :meth:`close` once done; then ``hashes[id]`` is the
    16-byte hash of chunk ``id`` (``[distinct chunks]``)."""

    __slots__ = ("hashes", "_ids")

    def __init__(self) -> None:
        self.hashes: list[bytes] = []
        self._ids: dict[bytes, int] | None = {}

    def number(self, hashes) -> tuple[int, ...]:
        """The ids of ``hashes`` (one request's, in prompt order), giving new hashes the next ids. Raises
        RuntimeError after :meth:`close`."""
        ids = self._ids
        if ids is None:
            raise RuntimeError("this chunk numbering is closed")
        return tuple([ids.setdefault(h, len(ids)) for h in hashes])

    def close(self) -> ChunkNumbering:
        """Keep the hashes in id order and drop the hash -> id dict; returns ``self``."""
        if self._ids is not None:
            self.hashes, self._ids = list(self._ids), None
        return self
