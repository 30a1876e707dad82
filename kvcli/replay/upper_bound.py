"""The token-granular reuse upper bound: what a radix tree with unlimited capacity would reuse.

SGLang's RadixAttention keeps every prefix at token granularity; with unlimited capacity a request reuses the
longest common prefix it shares with any earlier request of the same cache salt. That is the ceiling a chunk-hash
store approaches as the chunk size goes to 1; the gap to a chunked store's hit tokens is the loss to chunking.

A compressed radix tree (edges hold runs of tokens as numpy arrays; nodes only at branch points, so at most about
two per request). Matching compares whole edges with one vectorized ``!=``, never a Python loop over tokens.
Memory: each distinct token run is kept once (4 bytes per token).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np


class Segment(NamedTuple):
    """A run of tokens that later requests reused (:meth:`RadixUpperBound.shared_segments`).

    Attributes:
        cache_salt: the tenant. start: tokens of the prefix before it. tokens: ``[tokens]`` uint32, the run.
        reused: later requests whose reused prefix covers the whole run.
    """

    cache_salt: str
    start: int
    tokens: np.ndarray
    reused: int


class _Node:
    __slots__ = ("children",)

    def __init__(self) -> None:
        self.children: dict[int, _Edge] = {}


class _Edge:
    __slots__ = ("tokens", "child", "reused")

    def __init__(self, tokens: np.ndarray, child: _Node, reused: int = 0) -> None:
        self.tokens = tokens
        self.child = child
        self.reused = reused  # later requests whose match covered this whole edge


def _common(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


class RadixUpperBound:
    """Longest-prefix reuse at token granularity with unlimited capacity, one tree per cache salt."""

    def __init__(self) -> None:
        self._roots: dict[str, _Node] = {}

    def match_and_insert(self, tokens: np.ndarray, cache_salt: str = "") -> int:
        """Return the longest prefix of ``tokens`` (``[tokens]`` uint32) seen before under ``cache_salt``, in
        tokens, then insert ``tokens``. The request itself needs at least one token of compute, so callers
        serving the request may cap the reusable count at ``len(tokens) - 1``; this returns the raw match.
        """
        node = self._roots.setdefault(cache_salt, _Node())
        pos, n = 0, len(tokens)
        while pos < n:
            edge = node.children.get(int(tokens[pos]))
            if edge is None:
                node.children[int(tokens[pos])] = _Edge(tokens[pos:].copy(), _Node())
                return pos
            k = _common(edge.tokens, tokens[pos:])
            if k < len(edge.tokens):
                self._split(edge, k)
                edge.reused += 1
                pos += k
                if pos < n:
                    edge.child.children[int(tokens[pos])] = _Edge(tokens[pos:].copy(), _Node())
                return pos
            edge.reused += 1
            pos += k
            node = edge.child
        return pos

    def shared_segments(self) -> Iterator[Segment]:
        """Every run of tokens later requests reused, one per edge of the tree with a reuse: together they
        partition the matches, ``sum(len(s.tokens) * s.reused) == sum of match_and_insert's returns``. Depth
        first, children in insertion order; the arrays are the tree's own (do not modify them)."""
        for salt, root in self._roots.items():
            stack = [(root, 0)]
            while stack:
                node, depth = stack.pop()
                for edge in reversed(node.children.values()):
                    if edge.reused:
                        yield Segment(salt, depth, edge.tokens, edge.reused)
                        stack.append((edge.child, depth + len(edge.tokens)))

    @staticmethod
    def _split(edge: _Edge, k: int) -> None:
        tail = _Edge(edge.tokens[k:], edge.child, edge.reused)
        middle = _Node()
        middle.children[int(tail.tokens[0])] = tail
        edge.tokens, edge.child = edge.tokens[:k], middle
