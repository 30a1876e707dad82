"""Dense ids for chunk hashes: 0, 1, 2, ... in order of first sight, looked up a whole request at a time.

The one-pass curves (:mod:`kvcli.sim.stackdist`, :mod:`kvcli.sim.curve`) keep per-chunk state in numpy arrays
indexed by id. A Python dict of 16-byte ``bytes`` keys costs about 120 bytes per chunk here (the key object, the
int value, the table); this open-addressing table costs 24 to 48: both 64-bit halves of each hash by id (16 bytes,
so a match compares the full 128 bits: no truncation, no false hit) and an int32 id per slot at load <= 1/2 (8
bytes), each array doubling as it grows. Lookups and inserts run on numpy arrays of a whole request (linear
probing, a few rounds), no Python loop over chunks. The routing simulation's caches number their chunks with
:mod:`kvcli.sim.numbering` instead (Python ints; its docstring says why).

Source: open addressing with linear probing (Knuth, TAOCP vol. 3, 6.4, algorithm L); the slot is the hash's low
bits, which xxh3-128 spreads uniformly.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Hashes = Sequence[bytes] | bytes
"""One request's 16-byte chunk hashes in order: a sequence, or one ``bytes`` of them concatenated."""

_EMPTY = -1
_LOAD = 2  # table slots per key, at least: probe runs stay short (a few rounds per request)
_FEW = 32  # keys that a plain loop probes faster than rounds of numpy calls (~2x at 8 keys, even at ~48 here)
_REPLACE = 1 << 16  # keys placed at once when the table grows


class ChunkIds:
    """Maps 16-byte chunk hashes to dense int ids ``0 .. len(self) - 1``, assigned at first sight. Not thread-safe.

    Memory: 24 to 48 bytes per distinct hash (:attr:`nbytes`), doubling as it grows.
    """

    __slots__ = ("_lo", "_hi", "_table", "_count")

    def __init__(self, expected: int = 1024) -> None:
        self._lo = np.empty(max(expected, 16), np.uint64)
        self._hi = np.empty(max(expected, 16), np.uint64)
        self._table = np.full(max(16, 1 << (_LOAD * max(expected, 1) - 1).bit_length()), _EMPTY, np.int32)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """Bytes held by the table and the keys (numpy buffers)."""
        return self._lo.nbytes + self._hi.nbytes + self._table.nbytes

    def ids(self, hashes: Sequence[bytes]) -> tuple[np.ndarray, int]:
        """Ids of ``hashes`` (16 bytes each), assigning new ones to hashes never seen.

        Returns:
            ``(ids, first_new)``: int64 ``[len(hashes)]``; an id ``>= first_new`` was assigned by this call (its
            hash is new). Equal hashes in one call get one id.

        Raises:
            ValueError: a hash is not 16 bytes.
        """
        return self.ids_many([hashes])

    def ids_many(self, groups: Sequence[Hashes]) -> tuple[np.ndarray, int]:
        """:meth:`ids` of the concatenation of ``groups`` (e.g. several requests' hashes), in one lookup; a group is
        a sequence of 16-byte hashes or one ``bytes`` of them concatenated (:func:`count`)."""
        n = sum(map(count, groups))
        first_new = self._count
        if n == 0:
            return np.empty(0, np.int64), first_new
        keys = np.frombuffer(b"".join([g if isinstance(g, bytes) else b"".join(g) for g in groups]), dtype="<u8")
        if keys.size != 2 * n:
            raise ValueError("chunk hashes must be 16 bytes each")
        keys = keys.reshape(n, 2)
        self._reserve(self._count + n)
        return self._find_or_add(keys[:, 0], keys[:, 1]), first_new

    def _find_or_add(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        table, mask = self._table, len(self._table) - 1
        out = np.empty(len(lo), np.int64)
        slot = (lo & np.uint64(mask)).astype(np.int64)
        todo = np.arange(len(lo))
        while todo.size:
            if todo.size <= _FEW:
                self._finish(lo, hi, todo.tolist(), slot, out)
                break
            s = slot[todo]
            held = table[s].astype(np.int64)
            occupied = held != _EMPTY
            same = np.zeros(todo.size, bool)
            h = held[occupied]
            same[occupied] = (self._lo[h] == lo[todo[occupied]]) & (self._hi[h] == hi[todo[occupied]])
            out[todo[same]] = held[same]
            resolved = same
            free = np.flatnonzero(~occupied)
            if free.size:  # several keys may want one free slot: one takes it, the rest look again
                won = free[_claim(table, s[free])]
                winners = todo[won]
                new = np.arange(self._count, self._count + len(winners))
                table[s[won]] = new
                self._lo[new], self._hi[new] = lo[winners], hi[winners]
                out[winners] = new
                self._count += len(winners)
                resolved = resolved.copy()
                resolved[won] = True
            move = occupied & ~same
            slot[todo[move]] = (s[move] + 1) & mask
            todo = todo[~resolved]
        return out

    def _finish(self, lo: np.ndarray, hi: np.ndarray, todo: list[int], slot: np.ndarray, out: np.ndarray) -> None:
        """The same probing, one key at a time (small requests, and the few keys whose probe runs are long)."""
        table, mask, keys_lo, keys_hi = self._table, len(self._table) - 1, self._lo, self._hi
        for k in todo:
            s, klo, khi = int(slot[k]), lo[k], hi[k]
            while True:
                held = int(table[s])
                if held == _EMPTY:
                    held = self._count
                    table[s], keys_lo[held], keys_hi[held] = held, klo, khi
                    self._count += 1
                    break
                if keys_lo[held] == klo and keys_hi[held] == khi:
                    break
                s = (s + 1) & mask
            out[k] = held

    def _reserve(self, count: int) -> None:
        """Room for ``count`` keys: key arrays doubled when full; the table doubled (every key re-placed, keeping its
        id) when it would be more than ``1/_LOAD`` full."""
        n = self._count
        if count > len(self._lo):
            size = grown(len(self._lo), count)
            self._lo, self._hi = enlarged(self._lo, size, None), enlarged(self._hi, size, None)
        if _LOAD * count <= len(self._table):
            return
        size = len(self._table)
        while _LOAD * count > size:
            size *= 2
        del self._table  # the old table goes before the new one is made
        self._table = table = np.full(size, _EMPTY, np.int32)
        for start in range(0, n, _REPLACE):  # a slice at a time: the temporaries stay small
            end = min(n, start + _REPLACE)
            place(table, (self._lo[start:end] & np.uint64(size - 1)).astype(np.int64), np.arange(start, end))


def count(hashes: Hashes) -> int:
    """Hashes in a group: a sequence of 16-byte hashes, or one ``bytes`` of them concatenated (16 bytes each)."""
    return len(hashes) // 16 if isinstance(hashes, bytes) else len(hashes)


def enlarged(a: np.ndarray, length: int, fill=0) -> np.ndarray:
    """``a`` with ``length`` rows (a 1-D array's elements; a 2-D one's rows, appended), the new ones set to ``fill``
    (None: left as they come). Where ``a`` owns its buffer, the same array grown in place (``ndarray.resize``:
    ``realloc``, which for a large array remaps its pages instead of copying them: the old and the new array are
    never both held, as with ``np.concatenate``); else a new one. The caller holds no view of ``a`` (a slice would
    point into the buffer ``realloc`` may move)."""
    old = len(a)
    shape = (length,) + a.shape[1:]
    try:
        a.resize(shape, refcheck=False)
    except ValueError:  # a view, or not contiguous: a copy
        a = np.concatenate([a, np.empty((length - old,) + a.shape[1:], a.dtype)])
    if fill is not None:
        a[old:] = fill
    return a


def grown(have: int, need: int) -> int:
    """The new length of an array of ``have`` elements that must hold ``need``: at least double, a power of two
    when ``have`` is one, so lengths depend on the most ever needed, not on the steps that got there (one request at
    a time or a batch)."""
    return max(2 * have, 1 << (need - 1).bit_length())


def place(table: np.ndarray, home: np.ndarray, ids: np.ndarray) -> None:
    """Put distinct ``ids`` (int, ``>= 0``) into an open-addressing ``table`` (int32, a power of two long, empty slots
    -1, room for all of them) by linear probing from their ``home`` slots (int64, as long as ``ids``), vectorized:
    each round every id whose slot is free claims it (one per slot), the others move one slot on. An id passes only
    slots that were taken, so a lookup that probes from its home slot to the first empty one finds it, as with ids
    placed one at a time (in another order: a table's lookups do not depend on it)."""
    mask = len(table) - 1
    slot = np.array(home, np.int64)
    todo = np.arange(len(ids))
    while todo.size:
        s = slot[todo]
        free = np.flatnonzero(table[s] == _EMPTY)
        won = free[_claim(table, s[free])]
        table[s[won]] = ids[todo[won]]
        placed = np.zeros(todo.size, bool)
        placed[won] = True
        busy = np.ones(todo.size, bool)
        busy[free] = False
        slot[todo[busy]] = (s[busy] + 1) & mask
        todo = todo[~placed]


def _claim(table: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Which of ``slots`` (free table slots, possibly repeated) to fill: one index per distinct slot (whichever
    write landed), without a sort. The slots are left free for the caller to fill."""
    tags = -2 - np.arange(len(slots), dtype=np.int64)  # below _EMPTY, never an id
    table[slots] = tags
    won = np.flatnonzero(table[slots] == tags)
    table[slots] = _EMPTY
    return won
