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


class PrefixMatch(NamedTuple):
    """The longest prefix a request shares with the requests inserted before it (:meth:`RadixUpperBound.match`).

    Attributes:
        tokens: its length, tokens (the raw match; what a request reuses of it is capped at its prompt - 1).
        predecessor: the latest earlier request that shares it (the ``request`` it was inserted with), or -1 when
            ``tokens`` is 0 (nothing is shared).
        continues: that request goes on past the shared prefix (the two prompts diverge there); False when it ended
            there (this prompt extends it) or nothing is shared.
    """

    tokens: int
    predecessor: int
    continues: bool


class _Node:
    __slots__ = ("children", "last")

    def __init__(self, last: int = -1) -> None:
        self.children: dict[int, _Edge] = {}
        self.last = last  # the latest request that went on past this node (-1: none)


class _Edge:
    __slots__ = ("tokens", "child", "reused", "last")

    def __init__(self, tokens: np.ndarray, child: _Node, reused: int = 0, last: int = -1) -> None:
        self.tokens = tokens
        self.child = child
        self.reused = reused  # later requests whose match covered this whole edge
        self.last = last  # the latest request whose prompt holds this whole edge


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
        return self.match(tokens, cache_salt).tokens

    def match(self, tokens: np.ndarray, cache_salt: str = "", request: int = -1) -> PrefixMatch:
        """:meth:`match_and_insert` that also names the request the prefix came from: ``tokens`` is inserted as
        request number ``request`` (callers number requests in trace order), and the match names the latest earlier
        one that shares the whole prefix, and whether it goes on past it."""
        node = self._roots.setdefault(cache_salt, _Node())
        pos, n, edge_in = 0, len(tokens), None
        while pos < n:
            edge = node.children.get(int(tokens[pos]))
            if edge is None:
                found = self._ended(pos, node, edge_in)
                node.children[int(tokens[pos])] = _Edge(tokens[pos:].copy(), _Node(), last=request)
                node.last = request
                return found
            k = _common(edge.tokens, tokens[pos:])
            if k < len(edge.tokens):
                before = edge.last
                self._split(edge, k)
                edge.reused += 1
                edge.last = node.last = request
                pos += k
                if pos < n:
                    edge.child.children[int(tokens[pos])] = _Edge(tokens[pos:].copy(), _Node(), last=request)
                    edge.child.last = request
                return PrefixMatch(pos, before, True)
            edge.reused += 1
            node.last = request
            found = PrefixMatch(pos + k, edge.last, True)  # in case the prompt ends here
            edge.last = request
            pos += k
            edge_in, node = found, edge.child
        return self._ended(pos, node, edge_in) if edge_in is not None else PrefixMatch(0, -1, False)

    @staticmethod
    def _ended(pos: int, node: _Node, edge_in: PrefixMatch | None) -> PrefixMatch:
        """The match of a prompt that leaves the tree at ``node`` (``pos`` tokens in, through the edge whose latest
        request ``edge_in`` names): the latest request that went on past ``node``, else the one that ended there."""
        if pos == 0 or edge_in is None:
            return PrefixMatch(0, -1, False)
        if node.last >= 0 or node.children:
            return PrefixMatch(pos, node.last, True)
        return PrefixMatch(pos, edge_in.predecessor, False)

    def copy(self, cache_salt: str, as_salt: str = "") -> RadixUpperBound:
        """A new tree whose ``as_salt`` holds what this one holds under ``cache_salt`` (nothing else): the nodes
        copied, the token arrays shared (no tree modifies an array in place). Iterative: a deep tree does not
        recurse."""
        out = RadixUpperBound()
        root = self._roots.get(cache_salt)
        if root is None:
            return out
        top = out._roots[as_salt] = _Node(root.last)
        stack = [(root, top)]
        while stack:
            src, dst = stack.pop()
            for first, edge in src.children.items():
                child = _Node(edge.child.last)
                dst.children[first] = _Edge(edge.tokens, child, edge.reused, edge.last)
                stack.append((edge.child, child))
        return out

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
        tail = _Edge(edge.tokens[k:], edge.child, edge.reused, edge.last)
        middle = _Node(edge.last)
        middle.children[int(tail.tokens[0])] = tail
        edge.tokens, edge.child = edge.tokens[:k], middle
