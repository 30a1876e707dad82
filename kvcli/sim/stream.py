"""One chunk size's requests as dense chunk ids, kept for the offline simulations of the capacity planner.

The one-pass curve (:class:`kvcli.sim.curve.HitCurve`) already maps each request's 16-byte chunk hashes to dense
ids (:class:`kvcli.sim.chunkids.ChunkIds`); when the planner is asked for (``--tier``, ``--optimal``,
``--policy``, ``--admit-after``), it also keeps them here, so the tiers, the optimal bound and the policies run
after the replay on small ints without hashing anything again, and cost nothing when not asked for.

Memory: 4 bytes per chunk of every request plus 16 per request (int32 ids, int64 bounds and prompt lengths).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NEVER = np.iinfo(np.int64).max
"""Next use of a chunk that is never requested again."""


@dataclass(frozen=True)
class ChunkStream:
    """Requests in replay order, as chunk ids (prompt order; ids dense from 0, equal id = equal chunk hash).

    Attributes:
        chunk_size: tokens per chunk.
        ids: int32 ``[chunks]``: every request's chunk ids, concatenated.
        bounds: int64 ``[requests + 1]``: request ``r``'s chunks are ``ids[bounds[r]:bounds[r + 1]]``.
        prompt_tokens: int64 ``[requests]``: each prompt's length in tokens (-1: not known). A prompt made only of
            full chunks that hits them all still computes its last token (a "whole hit": one token less reused).
    """

    chunk_size: int
    ids: np.ndarray
    bounds: np.ndarray
    prompt_tokens: np.ndarray

    @property
    def requests(self) -> int:
        """Requests in the stream."""
        return len(self.prompt_tokens)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays."""
        return self.ids.nbytes + self.bounds.nbytes + self.prompt_tokens.nbytes

    def whole(self) -> np.ndarray:
        """bool ``[requests]``: the prompt is made only of full chunks (at least one), so a hit on all of them
        reuses one token less than its chunks hold."""
        lengths = np.diff(self.bounds)
        return (lengths > 0) & (self.prompt_tokens == lengths * self.chunk_size)

    def next_use(self) -> np.ndarray:
        """int64 ``[chunks]``: for each chunk of each request, the index of the next request with the same chunk
        (:data:`NEVER`: none). One stable sort by id."""
        n = len(self.ids)
        req = np.repeat(np.arange(self.requests, dtype=np.int64), np.diff(self.bounds))
        nxt = np.full(n, NEVER, np.int64)
        if n > 1:
            order = np.argsort(self.ids, kind="stable")
            same = self.ids[order[1:]] == self.ids[order[:-1]]
            nxt[order[:-1][same]] = req[order[1:][same]]
        return nxt

    def lists(self) -> tuple[list[int], list[int], list[int]]:
        """``(ids, bounds, prompt_tokens)`` as Python lists, for the simulations' per-request loops."""
        return self.ids.tolist(), self.bounds.tolist(), self.prompt_tokens.tolist()


def stream_of(chunk_size: int, requests: list[tuple[list[int], int | None]]) -> ChunkStream:
    """A stream from ``(chunk ids in prompt order, prompt tokens or None)`` per request (tests and small tools)."""
    ids = np.array([i for chunks, _ in requests for i in chunks], np.int32)
    bounds = np.zeros(len(requests) + 1, np.int64)
    np.cumsum([len(chunks) for chunks, _ in requests], out=bounds[1:])
    tokens = np.array([-1 if n is None else n for _, n in requests], np.int64)
    return ChunkStream(chunk_size, ids, bounds, tokens)


class StreamRecorder:
    """Collects :class:`ChunkStream` batches as the curve assigns ids (:meth:`add`), then :meth:`stream`."""

    __slots__ = ("chunk_size", "_ids", "_lengths", "_tokens")

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self._ids: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._tokens: list[np.ndarray] = []

    def add(self, ids: np.ndarray, lengths: np.ndarray, tokens: np.ndarray) -> None:
        """A batch: ids int ``[chunks]`` (concatenated), chunks per request and prompt tokens (-1: unknown)."""
        self._ids.append(ids.astype(np.int32))
        self._lengths.append(np.asarray(lengths, np.int64))
        self._tokens.append(np.asarray(tokens, np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes held so far."""
        return sum(a.nbytes for a in self._ids) + 2 * sum(a.nbytes for a in self._lengths)

    def stream(self) -> ChunkStream:
        """Everything added, in order."""
        ids = np.concatenate(self._ids) if self._ids else np.empty(0, np.int32)
        lengths = np.concatenate(self._lengths) if self._lengths else np.empty(0, np.int64)
        bounds = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=bounds[1:])
        tokens = np.concatenate(self._tokens) if self._tokens else np.empty(0, np.int64)
        return ChunkStream(self.chunk_size, ids, bounds, tokens)
