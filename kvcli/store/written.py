"""What a replay's store may have written: the chunk hashes of its keys, kept compactly, so that the run's cleanup
deletes its own keys with batched UNLINKs (:func:`delete_keys`) instead of a SCAN of the whole server.

A store records a chunk (:meth:`WrittenChunks.add`) before the command that writes it is sent, so that a write
whose reply was lost (a timeout, a dropped connection, Ctrl-C) is recorded too; a pipelined batch whose reply
never came records every chunk it named. What is recorded is therefore a superset of what was written, which the
cleanup may delete whole: it is the run's own namespace (made fresh for the run, no other writer), so a recorded
key that was never written, or was evicted or expired since, is absent and UNLINK skips it.

The keys are rebuilt from the hashes by each store's own key builder (:meth:`kvcli.store.chunkstore.ChunkStore.
written_keys`, :meth:`kvcli.store.lmcache_store.LMCacheStore.written_keys`).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

import numpy as np

from kvcli.errors import RedisFailure
from kvcli.store import cluster
from kvcli.store.resp import HASH_BYTES, bulk, command, unlink_hashes

METADATA, PAYLOAD = "m", "p"  # the kinds of a chunk's keys (kvcli's m:/p:, LMCache's metadata/kv_bytes)
KINDS = (METADATA, PAYLOAD)
COMPACT_BYTES = 16 << 20  # a kind's record is first made distinct once it holds 1 Mi hashes
DELETE_BATCH = 4096  # keys per UNLINK: a few ms of the server's time (it blocks other clients while it runs)
PIPELINE_BATCHES = 8  # UNLINKs per round trip on a single server


class WrittenChunks:
    """The 16-byte prefix hashes of the chunks whose keys one store may have written, per kind (metadata
    :data:`METADATA`, payload :data:`PAYLOAD`), each kind in one growing ``bytearray``: 16 bytes per recorded
    chunk and kind (an index-only replay records metadata only: 16 bytes per chunk written), plus the bytearray's
    over-allocation (up to 1/8). A chunk recorded again (written again after its eviction, or named by a batch
    whose reply was lost) is kept once whenever a kind's record reaches twice its size at the last compaction (at
    least :data:`COMPACT_BYTES`): the record stays within ~2x the distinct chunks' bytes. Picklable (a worker
    process returns its stores' records with its results).

    ``keep`` False: a record that keeps nothing (0 bytes), for a run whose cleanup needs none (kvcli's own
    embedded server, emptied whole): every method works, on an empty record."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self._hashes: dict[str, bytearray] = {kind: bytearray() for kind in KINDS}
        self._compacted: dict[str, int] = {kind: 0 for kind in KINDS}

    def add(self, kind: str, hashes: Iterable[bytes | bytearray]) -> None:
        """Record 16-byte ``hashes`` of ``kind`` (:data:`METADATA` or :data:`PAYLOAD`); nothing without ``keep``."""
        if not self.keep:
            return
        buf = self._hashes[kind]
        buf += b"".join(hashes)
        if len(buf) >= max(COMPACT_BYTES, 2 * self._compacted[kind]):
            self._compact(kind)

    def merge(self, other: WrittenChunks) -> None:
        """Record everything ``other`` holds (another process's record of the same store)."""
        for kind in KINDS:
            self.add(kind, (other._hashes[kind],))

    def chunks(self, kind: str) -> int:
        """Hashes of ``kind`` recorded (a chunk recorded twice since the last compaction counts twice)."""
        return len(self._hashes[kind]) // HASH_BYTES

    @property
    def nbytes(self) -> int:
        """Bytes the record holds (both kinds, not counting over-allocation)."""
        return sum(len(buf) for buf in self._hashes.values())

    def distinct_chunks(self, kind: str) -> int:
        """How many distinct hashes of ``kind`` are recorded; compacts the record."""
        self._compact(kind)
        return len(self._hashes[kind]) // HASH_BYTES

    def distinct(self, kind: str) -> bytes:
        """Every distinct hash of ``kind``, sorted, concatenated (16 bytes each); compacts the record."""
        self._compact(kind)
        return bytes(self._hashes[kind])

    def slices(self, kind: str, size: int = DELETE_BATCH) -> Iterator[bytes]:
        """:meth:`distinct` in slices of at most ``size`` hashes (``16 * size`` bytes each), copied one at a time."""
        self._compact(kind)
        buf, step = self._hashes[kind], size * HASH_BYTES
        for start in range(0, len(buf), step):
            yield bytes(buf[start:start + step])

    def _compact(self, kind: str) -> None:
        """Sort ``kind``'s hashes and keep each once: while it runs, ~3 copies of the record (numpy's sort and
        result, then the new bytearray)."""
        buf = self._hashes[kind]
        if buf:
            distinct = np.unique(np.frombuffer(buf, dtype=f"V{HASH_BYTES}"))
            self._hashes[kind] = buf = bytearray(distinct.view(np.uint8).data)
        self._compacted[kind] = len(buf)


class HashKeys(NamedTuple):
    """Keys named by chunk hashes: ``head + hash.hex()`` for each 16-byte hash of ``hashes`` (concatenated), in
    order; deleted without a Python string per key on a single server (:func:`delete_keys`)."""

    head: str
    hashes: bytes

    def keys(self) -> list[str]:
        """The keys, one string each."""
        return [self.head + x for x in hexes(self.hashes)]


def hexes(blob: bytes) -> list[str]:
    """The 32-digit hex of each 16-byte hash in ``blob`` (``hash.hex()``, one ``hex()`` call for all)."""
    text, step = blob.hex(), 2 * HASH_BYTES
    return [text[i:i + step] for i in range(0, len(text), step)]


def delete_keys(client, batches: Iterable[list | HashKeys], pipeline_batches: int = PIPELINE_BATCHES) -> int:
    """UNLINK each batch of keys (a list of keys, or :class:`HashKeys`; at most :data:`DELETE_BATCH` keys each, for
    the server's sake): on a single server ``pipeline_batches`` UNLINKs per round trip, packed from the hashes
    without a Python string per key (:func:`kvcli.store.resp.unlink_hashes`); on a cluster one UNLINK per key, one
    round trip per shard (:func:`kvcli.store.cluster.unlink`). An absent key is skipped by the server. Returns the
    keys deleted.

    Raises:
        RedisFailure: an UNLINK failed (refused, no reply within the timeout, connection gone); keys of earlier
            round trips are deleted, and the message says how many.
    """
    deleted, on_cluster = 0, cluster.is_cluster(client)
    queued: list[bytes] = []
    try:
        for batch in batches:
            if not batch:
                continue
            if on_cluster:
                deleted += cluster.unlink(client, batch.keys() if isinstance(batch, HashKeys) else batch)
                continue
            queued.append(unlink_hashes(batch.head, batch.hashes) if isinstance(batch, HashKeys)
                          else command(1 + len(batch), bulk(b"UNLINK"), *map(bulk, batch)))
            if len(queued) == pipeline_batches:
                deleted += _unlinked(client, queued, deleted)
                queued = []
        if queued:
            deleted += _unlinked(client, queued, deleted)
    except cluster.REDIS_ERRORS as exc:
        raise RedisFailure(f"Redis UNLINK failed: {exc}; {deleted:,} keys deleted before it") from None
    return deleted


def _unlinked(client, commands: list[bytes], before: int) -> int:
    """Keys the packed UNLINK ``commands`` deleted, sent in one round trip (:func:`kvcli.store.cluster.send_packed`).

    Raises:
        RedisFailure: an error reply (the keys of the UNLINKs before it and of earlier round trips, ``before``,
            counted in the message).
    """
    done = 0
    for reply in cluster.send_packed(client, commands):
        if isinstance(reply, Exception):
            raise RedisFailure(f"Redis UNLINK failed: {reply}; {before + done:,} keys deleted before it")
        done += int(reply)
    return done
