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

import tempfile
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

from kvcli.errors import RedisFailure
from kvcli.store import cluster
from kvcli.store.noreply import raise_no_reply
from kvcli.store.resp import HASH_BYTES, bulk, command, unlink_hashes

METADATA, PAYLOAD = "m", "p"  # the kinds of a chunk's keys (kvcli's m:/p:, LMCache's metadata/kv_bytes)
KINDS = (METADATA, PAYLOAD)
COMPACT_BYTES = 16 << 20  # a kind's record is first made distinct once it holds 1 Mi hashes
SPILL_BYTES = 1 << 20  # a kind's record in memory at most (64 Ki hashes); the rest in its temporary file
DELETE_BATCH = 4096  # keys per UNLINK: a few ms of the server's time (it blocks other clients while it runs)
PIPELINE_BATCHES = 8  # UNLINKs per round trip on a single server


class WrittenChunks:
    """The 16-byte prefix hashes of the chunks whose keys one store may have written, per kind (metadata
    :data:`METADATA`, payload :data:`PAYLOAD`): 16 bytes per recorded chunk and kind (an index-only replay records
    metadata only: 16 bytes per chunk written). Each kind keeps at most :data:`SPILL_BYTES` in memory; the rest is
    appended to a temporary file of its own (unnamed, gone with the process), so a replay's memory does not grow
    with the chunks it writes. A chunk recorded again (written again after its eviction, or named by a batch whose
    reply was lost) is kept once whenever a kind's record reaches twice its size at the last compaction (at least
    :data:`COMPACT_BYTES`): the record stays within ~2x the distinct chunks' bytes. Picklable (a worker process
    returns its stores' records with its results; the pickle holds the file's hashes).

    ``keep`` False: a record that keeps nothing (0 bytes), for a run whose cleanup needs none (kvcli's own
    embedded server, emptied whole): every method works, on an empty record."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self._hashes: dict[str, bytearray] = {kind: bytearray() for kind in KINDS}  # the tail, in memory
        self._files: dict[str, Any] = {kind: None for kind in KINDS}  # the rest: a temporary file, or None
        self._spilled: dict[str, int] = {kind: 0 for kind in KINDS}  # bytes in the file
        self._compacted: dict[str, int] = {kind: 0 for kind in KINDS}
        self._on_disk = True  # False once a write to a file failed (a full disk): everything stays in memory

    def add(self, kind: str, hashes: Iterable[bytes | bytearray]) -> None:
        """Record 16-byte ``hashes`` of ``kind`` (:data:`METADATA` or :data:`PAYLOAD`); nothing without ``keep``."""
        if not self.keep:
            return
        buf = self._hashes[kind]
        buf += b"".join(hashes)
        if len(buf) >= SPILL_BYTES and self._on_disk:
            self._spill(kind)
        if self._recorded(kind) >= max(COMPACT_BYTES, 2 * self._compacted[kind]):
            self._compact(kind)

    def merge(self, other: WrittenChunks) -> None:
        """Record everything ``other`` holds (another process's record of the same store)."""
        for kind in KINDS:
            self.add(kind, other._blobs(kind, SPILL_BYTES))

    def chunks(self, kind: str) -> int:
        """Hashes of ``kind`` recorded (a chunk recorded twice since the last compaction counts twice)."""
        return self._recorded(kind) // HASH_BYTES

    @property
    def nbytes(self) -> int:
        """Bytes the record holds in memory (both kinds, not counting over-allocation; the rest is on disk)."""
        return sum(len(buf) for buf in self._hashes.values())

    def distinct_chunks(self, kind: str) -> int:
        """How many distinct hashes of ``kind`` are recorded; compacts the record."""
        self._compact(kind)
        return self._recorded(kind) // HASH_BYTES

    def distinct(self, kind: str) -> bytes:
        """Every distinct hash of ``kind``, sorted, concatenated (16 bytes each); compacts the record."""
        self._compact(kind)
        return b"".join(self._blobs(kind, SPILL_BYTES))

    def slices(self, kind: str, size: int = DELETE_BATCH) -> Iterator[bytes]:
        """:meth:`distinct` in slices of at most ``size`` hashes (``16 * size`` bytes each), read one at a time."""
        self._compact(kind)
        return self._blobs(kind, size * HASH_BYTES)

    def __getstate__(self) -> dict:
        return {"keep": self.keep, "hashes": {kind: b"".join(self._blobs(kind, SPILL_BYTES)) for kind in KINDS},
                "compacted": dict(self._compacted)}

    def __setstate__(self, state: dict) -> None:
        self.keep = state["keep"]
        self._hashes = {kind: bytearray() for kind in KINDS}
        self._files, self._spilled = {kind: None for kind in KINDS}, {kind: 0 for kind in KINDS}
        self._compacted, self._on_disk = {kind: 0 for kind in KINDS}, True
        for kind, blob in state["hashes"].items():
            self.add(kind, (blob,))
        self._compacted = state["compacted"]

    def _recorded(self, kind: str) -> int:
        return self._spilled[kind] + len(self._hashes[kind])

    def _spill(self, kind: str) -> None:
        """Move the in-memory tail of ``kind`` to the end of its file (made now if it has none). A file that cannot
        be made or written (no room) keeps the record whole: from then on it grows in memory."""
        buf = self._hashes[kind]
        try:
            if self._files[kind] is None:
                self._files[kind] = tempfile.TemporaryFile(prefix="kvcli-written-")
            f = self._files[kind]
            f.seek(self._spilled[kind])
            f.write(buf)
            f.flush()
        except OSError:
            self._on_disk = False  # what the file holds up to _spilled stands; the tail stays here
            return
        self._spilled[kind] += len(buf)
        self._hashes[kind] = bytearray()

    def _blobs(self, kind: str, size: int) -> Iterator[bytes]:
        """The record of ``kind`` in order (file, then memory), in pieces of ``size`` bytes (a multiple of 16)."""
        f, left = self._files[kind], self._spilled[kind]
        if f is not None:
            f.seek(0)
            while left > 0:
                piece = f.read(min(size, left))
                left -= len(piece)
                yield piece
        buf = self._hashes[kind]
        for start in range(0, len(buf), size):
            yield bytes(buf[start:start + size])

    def _compact(self, kind: str) -> None:
        """Sort ``kind``'s hashes and keep each once (:func:`sorted_distinct`): while it runs, a few copies of the
        record in memory, then back to the file past :data:`SPILL_BYTES`."""
        if self._recorded(kind) and self._recorded(kind) != self._compacted[kind]:  # something added since
            whole = b"".join(self._blobs(kind, SPILL_BYTES))
            distinct = sorted_distinct(whole)
            del whole
            self._spilled[kind] = 0
            if self._files[kind] is not None:
                self._files[kind].truncate(0)
            self._hashes[kind] = bytearray(distinct)
            if len(distinct) >= SPILL_BYTES and self._on_disk:
                self._spill(kind)
        self._compacted[kind] = self._recorded(kind)


def sorted_distinct(hashes: bytes) -> bytes:
    """The 16-byte hashes concatenated in ``hashes``, each once, in byte order (as ``sorted``): sorted by their
    first 8 bytes (one big-endian uint64 sort, ~3x faster than sorting on both halves; a 16-byte void dtype's
    ``np.unique`` would also import numpy.ma), then by the last 8 within the runs of equal first halves (hash
    collisions of 64 bits and chunks recorded twice: few)."""
    halves = np.frombuffer(hashes, ">u8").reshape(-1, 2)
    ordered = halves[np.argsort(halves[:, 0].astype(np.uint64))]  # native byte order: ~3x faster to sort
    tie = np.flatnonzero(ordered[1:, 0] == ordered[:-1, 0])
    if tie.size:  # the rows of each run of equal first halves, sorted on both
        rows = np.unique(np.concatenate([tie, tie + 1]))
        ordered[rows] = ordered[rows][np.lexsort((ordered[rows, 1], ordered[rows, 0]))]
    keep = np.ones(len(ordered), bool)
    keep[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    return ordered[keep].tobytes()


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
        NoReply: an UNLINK got no reply (within the timeout, or the connection kept dropping): the same batches may
            be sent again. RedisFailure: an UNLINK was refused. Either way keys of earlier round trips are deleted,
            and the message says how many.
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
        raise_no_reply(exc, "UNLINK", f"Redis UNLINK failed: {exc}; {deleted:,} keys deleted before it")
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
