"""The token-granular reuse upper bound: what a radix tree with unlimited capacity would reuse.

SGLang's RadixAttention keeps every prefix at token granularity; with unlimited capacity a request reuses the
longest common prefix it shares with any earlier request of the same cache salt. That is the ceiling a chunk-hash
store approaches as the chunk size goes to 1; the gap to a chunked store's hit tokens is the loss to chunking.

A compressed radix tree (edges hold runs of tokens as numpy arrays; nodes only at branch points, so at most about
two per request). Matching compares whole edges with one vectorized ``!=``, never a Python loop over tokens.
Memory: each distinct token run is kept once (4 bytes per token).

A hash-id request (its token ids synthesized from block keys, :class:`kvcli.traces.request.BlockKeys`) is matched
on its keys instead, by :class:`BlockTrie`, with the same result and about 100 bytes per distinct block rather
than 4 bytes per token (the replay's memory stays near flat as a long hash-id trace goes on).
:class:`UpperBound` picks the tree per request.
"""
from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from kvcli.sim.chunkids import place
from kvcli.traces.request import Request
from kvcli.traces.synth import SYNTH_VOCAB, block_token_ids, first_token_ids


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


_FIRST_BITS = (SYNTH_VOCAB - 1).bit_length()  # a synthesized token id fits in these bits
_FIRSTS = (1 << _FIRST_BITS) - 1
_ROOT = (1 << 64) - 1  # a root's place (it has no parent): never a child's
_MIX = 0x9E3779B1  # spreads a first token over the child table (Knuth's multiplicative hashing constant)
_REPLACE = 1 << 16  # nodes placed at once when the child table grows


class BlockTrie:
    """:meth:`RadixUpperBound.match_and_insert` for requests whose token ids were synthesized from block keys at
    one block size ``B`` (:func:`kvcli.traces.synth.block_token_ids`), computed on the keys: equal results.

    Why it is exact: token ``j`` of a block is a function of ``(key, j)`` alone, so two blocks of equal keys hold
    equal tokens (up to the shorter of the two, for a request's partial last block). Blocks of distinct keys are
    independent draws: they agree on a block's first ``t`` tokens with probability ``SYNTH_VOCAB**-t``, so they
    may share a few leading tokens (compared here, token by token: the tail correction) but never a whole block of
    ``B >= MIN_BLOCK_TOKENS`` tokens (probability ``100256**-8 < 1e-40`` a pair). A request's match is then the
    blocks it shares key by key with an earlier request of the same cache salt, whole, plus the tokens its first
    unshared block shares with the block of any earlier request at that point that starts with the same token.

    A node is a block at its place in a prefix of blocks. Each node keeps its place (parent node and first token,
    packed in one int), its key, the most tokens of its block any request held and its first child, in ``array``
    columns; a node's further children (a prompt that diverges from an earlier one there) are found through one
    open-addressing table of node ids keyed by place (linear probing from a hash of the place; several children of
    one place, keys that start with the same token, sit in one probe run). A new prompt's fresh blocks are a chain of
    first children: no table entry. Memory: ~25-35 bytes per node, no Python object per node.
    """

    MIN_BLOCK_TOKENS = 8

    def __init__(self, block_tokens: int) -> None:
        if block_tokens < self.MIN_BLOCK_TOKENS:
            raise ValueError(f"a block trie needs blocks of at least {self.MIN_BLOCK_TOKENS} tokens, "
                             f"got {block_tokens}")
        self.block_tokens = block_tokens
        self._place = array("Q")  # node -> parent << _FIRST_BITS | its block's first token (a root: _ROOT)
        self._key = array("Q")  # node -> its block key (a root: 0)
        self._held = array("I")  # node -> the most tokens of its block a request held (a root: B)
        self._first = array("i")  # node -> its first child, -1 for none
        self._table = array("i", [-1]) * 1024  # slot -> a further child, -1 empty; at most half full
        self._further = 0  # nodes in the table
        self._roots: dict[str, int] = {}

    @property
    def nodes(self) -> int:
        """Nodes in the trie (roots included)."""
        return len(self._key)

    @property
    def nbytes(self) -> int:
        """Bytes of the columns and the table (their items, not the arrays' spare room)."""
        return sum(a.itemsize * len(a) for a in (self._place, self._key, self._held, self._first, self._table))

    def _root(self, cache_salt: str) -> int:
        node = self._roots.get(cache_salt, -1)
        if node < 0:
            node = self._roots[cache_salt] = len(self._key)
            self._place.append(_ROOT)
            self._key.append(0)
            self._held.append(self.block_tokens)
            self._first.append(-1)
        return node

    def _child(self, parent: int, first: int, key: int) -> int:
        """The child of ``parent`` with block key ``key`` (first token ``first``), or -1."""
        child = self._first[parent]
        if child < 0 or self._key[child] == key:
            return child
        table, mask, where = self._table, len(self._table) - 1, parent << _FIRST_BITS | first
        slot = (first * _MIX ^ parent) & mask
        while (child := table[slot]) >= 0 and (self._place[child] != where or self._key[child] != key):
            slot = (slot + 1) & mask
        return child

    def _add(self, parent: int, firsts: list[int], keys: list[int], held: list[int]) -> None:
        """A chain of new nodes below ``parent``: the first a child of ``parent``, each next one the first child of
        the one before, with ``firsts``, ``keys`` and ``held``."""
        node = len(self._key)
        if self._first[parent] < 0:
            self._first[parent] = node
        else:  # a further child: into the table
            self._reserve(self._further + 1)
            table, mask = self._table, len(self._table) - 1
            slot = (firsts[0] * _MIX ^ parent) & mask
            while table[slot] >= 0:
                slot = (slot + 1) & mask
            table[slot] = node
            self._further += 1
        count = len(keys)
        self._place.extend([p << _FIRST_BITS | f for p, f in zip([parent, *range(node, node + count - 1)], firsts)])
        self._key.extend(keys)
        self._held.extend(held)
        self._first.extend(range(node + 1, node + count))
        self._first.append(-1)

    def _reserve(self, further: int) -> None:
        """A table with room for ``further`` children at most half full: doubled, every further child placed again
        (vectorized, :data:`_REPLACE` nodes at a time, so the temporary arrays stay small whatever the trie's
        size)."""
        size = len(self._table)
        if 2 * further <= size:
            return
        while 2 * further > size:
            size *= 2
        self._table = array("i", [-1]) * size
        table = np.frombuffer(self._table, np.int32)  # views: the columns can grow again once they are gone
        places = np.frombuffer(self._place, np.uint64) if len(self._place) else np.empty(0, np.uint64)
        firsts = np.frombuffer(self._first, np.int32) if len(self._first) else np.empty(0, np.int32)
        for start in range(0, len(places), _REPLACE):
            nodes = np.arange(start, min(start + _REPLACE, len(places)))
            where = places[nodes]
            inner = where != np.uint64(_ROOT)
            nodes, where = nodes[inner], where[inner]
            parents = (where >> np.uint64(_FIRST_BITS)).astype(np.int64)
            keep = firsts[parents] != nodes  # not its parent's first child: a further one
            nodes, where = nodes[keep], where[keep]
            home = ((where & np.uint64(_FIRSTS)) * np.uint64(_MIX) ^ (where >> np.uint64(_FIRST_BITS))
                    ) & np.uint64(size - 1)
            place(table, home.astype(np.int64), nodes)
        del table, places, firsts

    def _tail(self, parent: int, first: int, key: int, keys: np.ndarray, i: int, held: int) -> int:
        """The most leading tokens block ``i`` of ``keys`` (its first ``held`` tokens) shares with the block of a
        child of ``parent`` at ``first`` of another key (0 when there is none, almost always: only then are the
        tokens synthesized)."""
        where, others = parent << _FIRST_BITS | first, []
        child = self._first[parent]
        if child >= 0 and self._place[child] == where and self._key[child] != key:
            others.append(child)
        table, mask = self._table, len(self._table) - 1
        slot = (first * _MIX ^ parent) & mask
        while (child := table[slot]) >= 0:
            if self._place[child] == where and self._key[child] != key:
                others.append(child)
            slot = (slot + 1) & mask
        best = 0
        if others:
            block = block_token_ids(keys[i:i + 1], self.block_tokens, held)
            for child in others:
                other = block_token_ids(np.array([self._key[child]], np.uint64), self.block_tokens,
                                        min(self._held[child], held))
                best = max(best, _common(other, block))
        return best

    def match_and_insert(self, keys: np.ndarray, length: int, cache_salt: str = "") -> int:
        """The longest prefix of the prompt ``block_token_ids(keys, B, length)`` seen before under ``cache_salt``,
        in tokens (as :meth:`RadixUpperBound.match_and_insert`), then the prompt inserted. Only the first token of
        each block and, where a block of another key starts with the same token at that place, the tokens of the
        first block not shared whole are synthesized.

        Args:
            keys: ``[blocks]`` uint64 block keys, ``blocks == ceil(length / B)``.
            length: the prompt's tokens.
            cache_salt: the tenant.

        Raises:
            ValueError: ``keys`` and ``length`` of different lengths in blocks.
        """
        b, n = self.block_tokens, length
        if len(keys) != -(-n // b):
            raise ValueError(f"{len(keys)} block keys for {n} tokens at {b} tokens per block")
        node = self._root(cache_salt)
        firsts, ks = first_token_ids(keys, b).tolist(), keys.tolist()
        first_of, key_of, held_of = self._first, self._key, self._held
        last = len(ks) - 1
        for i, (first, key) in enumerate(zip(firsts, ks)):
            held = b if i < last else n - i * b
            child = first_of[node]  # the usual case inline: the first child, of this key
            if child < 0 or key_of[child] != key:
                child = self._child(node, first, key)
            if child >= 0 and held_of[child] >= held:
                node = child  # the whole block shared
                continue
            shared = max(held_of[child] if child >= 0 else 0, self._tail(node, first, key, keys, i, held))
            if child >= 0:
                held_of[child] = held
                node, i = child, i + 1  # the rest of the prompt is new: a chain of fresh nodes below it
            if i <= last:
                count = last - i + 1
                self._add(node, firsts[i:], ks[i:], [b] * (count - 1) + [n - last * b])
            return (i - (child >= 0)) * b + shared
        return n

    def prompts(self) -> Iterator[tuple[str, np.ndarray]]:
        """``(cache salt, tokens)`` of every path from a root to a leaf, token ids synthesized again: inserted into
        a :class:`RadixUpperBound` in any order, they give it the prefixes this trie holds, so every later match
        is the same. Depth first; each path ``[tokens]`` uint32."""
        below: dict[int, list[int]] = {}
        for node, where in enumerate(self._place):
            if where != _ROOT:
                below.setdefault(where >> _FIRST_BITS, []).append(node)
        b = self.block_tokens
        for salt, root in self._roots.items():
            stack: list[tuple[int, list[int]]] = [(c, [c]) for c in below.get(root, [])]
            while stack:
                node, path = stack.pop()
                children = below.get(node)
                if children:
                    stack.extend((c, path + [c]) for c in children)
                    continue
                keys = np.array([self._key[c] for c in path], np.uint64)
                yield salt, block_token_ids(keys, b, (len(path) - 1) * b + self._held[path[-1]])


class UpperBound:
    """The token-granular upper bound of a replay: :class:`BlockTrie` for hash-id requests (of one block size),
    :class:`RadixUpperBound` for the others; equal matches either way. A trace that mixes block sizes, or a request
    without block keys after hash-id ones, moves what the trie holds into a radix tree (:meth:`BlockTrie.prompts`)
    and goes on there: tokens of different block sizes can coincide (``key * B + j`` is the same for other ``key``
    and ``B``), which only the radix tree sees."""

    def __init__(self) -> None:
        self._trie: BlockTrie | None = None
        self._radix: RadixUpperBound | None = None

    def match_request(self, request: Request) -> int:
        """The longest prefix of ``request.token_ids`` that an earlier request of its cache salt held (tokens),
        then the request inserted (:meth:`RadixUpperBound.match_and_insert`)."""
        blocks, salt = request.blocks, request.hash_salt
        if self._radix is None and blocks is not None and blocks.block_tokens >= BlockTrie.MIN_BLOCK_TOKENS:
            if self._trie is None:
                self._trie = BlockTrie(blocks.block_tokens)
            if self._trie.block_tokens == blocks.block_tokens:
                return self._trie.match_and_insert(blocks.keys, blocks.length, salt)
        tokens = request.token_ids
        if self._radix is None:
            self._radix = RadixUpperBound()
            for path_salt, path in self._trie.prompts() if self._trie is not None else ():
                self._radix.match_and_insert(path, path_salt)
            self._trie = None
        return self._radix.match_and_insert(tokens, salt)
