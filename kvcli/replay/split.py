"""One chunk size on several cores: a trace's requests split by their prefix root into parts replayed at once, with
the figures one process gives.

Why a split is exact. In a replay with unlimited capacity a request hits the longest run of its chunks, from chunk 0,
that any earlier request wrote; a chunk hash names the whole prefix before it (:mod:`kvcli.store.hashing`), so two
requests share a chunk only where they share every chunk before it. Requests are grouped by their first ``depth``
chunks (a request with fewer full chunks by all of them), the groups packed into parts of about equal work, and
each part replays its requests in arrival order in the run's one namespace. A chunk held by requests of two parts
lies in the first ``depth - 1`` chunks of both (deeper, a chunk names its group); such a chunk is *shared* (and so
is every chunk before it), and the request where it first occurs is replayed *first*, with the other such requests,
in arrival order, before the parts start. Each request then finds exactly the chunks one process would have written
before it:

- a request replayed first: the chunks of its own that came before it are shared ones (a chunk of its that an
  earlier request held lies before its shared chunk, and is shared too), first written by requests replayed before
  it; nothing after it wrote any chunk of its (a request holding one would hold its shared chunk, which first
  occurs here);
- any other request: a shared chunk of its was written by a request replayed first, which came before it (it is the
  chunk's first occurrence); any other chunk of its was written by requests of its own part, which ran before it in
  order; and no request replayed first that came after it wrote a chunk it holds (that would be an earlier
  occurrence).

So every request's hit run, every write, object and byte, and every request's ledger entry are the single
process's; round trips and batches differ (each part cuts its own), and timings are each process's own. With
``depth`` 1 the parts are the trace's prefix roots (a request's first chunk) and nothing is shared.

The figures that need one global order come from a merged stream: each part sends back its requests' chunk hashes,
and the parent feeds them in arrival order to the capacity/TTL curve (and the planner's recorded stream), as one
process would (:func:`kvcli.replay.lane.curve_figures`). The token-granular upper bound is split too: each part's
radix tree holds its own requests whole and the other requests' first ``depth`` chunks of tokens, in arrival
order. Two requests of different parts share fewer than ``depth`` chunks, so their common prefix is shorter than
``depth`` chunks of tokens, and the tree sees all of it: each request's match is the one tree of the whole trace
would give. Those heads are the same for every request of a group (its key), so each group's first request's head
stands for them all (:attr:`Split.leads`): one insertion per group, and one per request shorter than the key.

What bounds the speedup: the requests replayed first (before the parts) and the largest part. Mooncake's
conversation trace starts every request with the same 512-token block (a shared system prompt): one root at any
chunk size up to 512, so depth 1 leaves one part; depth 2 (the conversation's next block) splits it into hundreds
of groups, and only the first request (the shared block's first occurrence) is replayed first.
"""
from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from kvcli.replay.lane import curve_figures, curve_of, store_memory
from kvcli.replay.results import ChunkSizeResult
from kvcli.replay.work import Part, Share, Work, head
from kvcli.store.hashing import PromptChunker
from kvcli.store.kvstore import KVStore
from kvcli.traces.request import HashIdRequest, Request

HEAD_TOKENS = 2048
"""Tokens of each prompt the parent hashes to key the split (and matches in its radix tree): the deepest key at
chunk size ``cs`` is ``HEAD_TOKENS // cs`` chunks (at least one)."""

DEPTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
"""Key depths (chunks) tried, shallow first; those past ``HEAD_TOKENS`` tokens are not."""

NEAR = 1.01
"""A deeper key is taken only when its estimated time is below the shallower one's over this factor."""

MIN_BOUND = 1.2
"""A split whose :attr:`Split.bound` is below this is not worth its cost (the parent's pass over the heads, each
part's read of the whole trace): the trace is replayed whole."""


@dataclass(frozen=True)
class Split:
    """A trace's requests split into parts (module docstring).

    Attributes:
        depth: chunks of the key the requests were grouped by (1: their prefix root).
        groups: distinct keys (groups of requests) in the trace.
        first: the requests replayed first, in arrival order, before the parts (ascending indices): where a shared
            chunk first occurs.
        parts: per part, the indices ``[requests of the part]`` (ascending, arrival order) of its requests, those
            replayed first among them (its radix tree holds them all; it replays the others).
        tokens: prompt tokens each part replays ``[parts]``.
        first_tokens: prompt tokens of the requests replayed first. total_tokens: of the whole trace.
        leads: bool ``[requests]``: the first request of each group, and every request with fewer full chunks than
            the key (whose head is its whole prompt): the heads the other parts' radix trees take.
        kept: the trace's requests as the parent read them for the split, where holding them costs little (hash-id
            requests: their block keys, no token ids), for the units it replays itself; else None.
    """

    depth: int
    groups: int
    first: np.ndarray
    parts: tuple[np.ndarray, ...]
    tokens: tuple[int, ...]
    first_tokens: int
    total_tokens: int
    leads: np.ndarray
    kept: list[Request] | None = field(default=None, repr=False, compare=False)

    @property
    def largest_share(self) -> float:
        """The largest part's share of the trace's prompt tokens (0-1)."""
        return max(self.tokens) / self.total_tokens if self.total_tokens else 0.0

    @property
    def first_share(self) -> float:
        """The share of the trace's prompt tokens replayed first, before the parts start (0-1)."""
        return self.first_tokens / self.total_tokens if self.total_tokens else 0.0

    @property
    def bound(self) -> float:
        """The most the split can speed the replay up, by prompt tokens: the trace's work over that of the requests
        replayed first plus the largest part's (with as many cores as parts, each part as fast as one process)."""
        serial = self.first_tokens + max(self.tokens)
        return self.total_tokens / serial if serial else 1.0

    def replayed(self, part: int) -> np.ndarray:
        """The requests part ``part`` replays (its own, less those replayed first)."""
        own = self.parts[part]
        return np.setdiff1d(own, self.first, assume_unique=True)

    def note(self, chunk_size: int) -> str:
        """The split in one line, for the report's notes."""
        key = "prefix root (first chunk)" if self.depth == 1 else f"first {self.depth} chunks"
        first = len(self.first)
        before = (f", and {first:,} request{'' if first == 1 else 's'} ({self.first_share:.1%} of the tokens) "
                  f"holding chunks two parts share {'was' if first == 1 else 'were'} replayed first") if first else ""
        return (f"chunk size {chunk_size} replayed in {len(self.parts)} parts at once, its requests split by their "
                f"{key} ({self.groups:,} groups): the largest part holds {self.largest_share:.0%} of the prompt "
                f"tokens{before}: at most {self.bound:.2f}x one process's speed")

    def to_dict(self) -> dict:
        """JSON-ready: depth, groups, parts, prefix requests, tokens per part, shares and the bound."""
        return {"depth_chunks": self.depth, "groups": self.groups, "parts": len(self.parts),
                "first_requests": len(self.first), "first_tokens": self.first_tokens,
                "part_tokens": list(self.tokens), "total_tokens": self.total_tokens,
                "largest_part_ratio": self.largest_share, "bound_speedup": self.bound}


def read_heads(requests: Iterable[Request], limit: int, chunker: PromptChunker
               ) -> tuple[list[list[bytes]], list[Request] | None]:
    """The chunk hashes of each request's first :data:`HEAD_TOKENS` tokens (at least one chunk) at ``chunker``'s
    chunk size, ``[requests][chunks]`` (16 bytes each; arrival order), for the first ``limit`` requests; and the
    requests themselves where they are all hash-id requests whose token ids were not synthesized (a few keys each:
    the parent replays its units from them rather than reading the trace again), else None.

    Raises:
        BadInputError, ValueError: as the trace's reader and :meth:`PromptChunker.hashes`.
    """
    tokens = max(HEAD_TOKENS, chunker.chunk_size)
    heads: list[list[bytes]] = []
    kept: list[Request] | None = []
    for request in itertools.islice(requests, limit):
        cut = head(request, tokens)
        heads.append(chunker.hashes(cut.prompt, cut.hash_salt)[0] if cut.prompt_tokens else [])
        if kept is not None:
            if isinstance(request, HashIdRequest):
                kept.append(request)
            else:
                kept = None
    return heads, kept


def plan_split(heads: list[list[bytes]], weights: np.ndarray, parts: int) -> Split | None:
    """The split of requests with chunk hashes ``heads`` (arrival order, each request's first chunks) and work
    ``weights`` (prompt tokens ``[requests]``) into at most ``parts`` parts that is quickest by
    :func:`estimate` over the key depths of :data:`DEPTHS` the heads reach; None when no depth gives two parts
    (every request under one root as deep as the heads go, or ``parts`` < 2) or the best would speed the replay up
    less than :data:`MIN_BOUND`.

    Groups are packed heaviest first into the lightest part (ties: the lower part; groups of equal weight in order
    of their first request), so the plan is deterministic.
    """
    if parts < 2 or not heads:
        return None
    ids, first = _number(heads)
    lengths = np.fromiter(map(len, heads), np.int64, len(heads))
    deepest = int(lengths.max()) if len(lengths) else 0
    best: tuple[float, Split] | None = None
    for depth in (d for d in DEPTHS if d <= max(deepest, 1)):
        split = _split_at(ids, lengths, first, weights, parts, depth)
        if split is None:
            continue
        cost = estimate(split)
        if best is None or cost * NEAR < best[0]:
            best = (cost, split)
    return None if best is None or best[1].bound < MIN_BOUND else best[1]


def estimate(split: Split) -> float:
    """The split's time in prompt tokens of one process: the requests replayed first, then the largest part."""
    return split.first_tokens + max(split.tokens)


def _number(heads: list[list[bytes]]) -> tuple[np.ndarray, np.ndarray]:
    """The heads' chunks as dense ids ``[requests, deepest]`` (-1 past a request's chunks) and each id's first
    request ``[ids]``."""
    deepest = max(map(len, heads), default=0)
    ids = np.full((len(heads), max(deepest, 1)), -1, np.int64)
    number: dict[bytes, int] = {}
    first: list[int] = []
    for r, hashes in enumerate(heads):
        row = ids[r]
        for j, h in enumerate(hashes):
            k = number.get(h)
            if k is None:
                k = number[h] = len(first)
                first.append(r)
            row[j] = k
    return ids, np.asarray(first, np.int64)


def _split_at(ids: np.ndarray, lengths: np.ndarray, first: np.ndarray, weights: np.ndarray, parts: int,
              depth: int) -> Split | None:
    """The split keyed by the first ``depth`` chunks (module docstring), or None with one non-empty part."""
    count = len(lengths)
    rows = np.arange(count)
    keys = np.where(lengths > 0, ids[rows, np.clip(np.minimum(lengths, depth) - 1, 0, None)], -1)
    groups, group_of = np.unique(keys, return_inverse=True)
    group_weight = np.bincount(group_of, weights=weights, minlength=len(groups))
    group_first = np.full(len(groups), count, np.int64)
    np.minimum.at(group_first, group_of, rows)
    order = sorted(range(len(groups)), key=lambda g: (-group_weight[g], group_first[g]))
    loads = [(0.0, b) for b in range(parts)]  # a heap of (load, part)
    part_of_group = np.zeros(len(groups), np.int64)
    for g in order:
        load, b = heapq.heappop(loads)
        part_of_group[g] = b
        heapq.heappush(loads, (load + float(group_weight[g]), b))
    part = part_of_group[group_of]
    # shared chunks: in the first depth - 1 columns, held by requests of two parts; their first occurrences are
    # replayed first
    first_of = np.zeros(0, np.int64)
    cols = min(depth - 1, ids.shape[1])
    if cols > 0:
        chunk = ids[:, :cols].ravel()
        owner = np.repeat(part, cols)
        held = chunk >= 0
        chunk, owner = chunk[held], owner[held]
        if chunk.size:
            low = np.full(len(first), parts, np.int64)
            high = np.full(len(first), -1, np.int64)
            np.minimum.at(low, chunk, owner)
            np.maximum.at(high, chunk, owner)
            first_of = np.unique(first[(high >= 0) & (low != high)])
    members = [np.flatnonzero(part == b) for b in range(parts)]
    members = [m for m in members if m.size]
    if len(members) < 2:
        return None
    later = np.ones(count, bool)
    later[first_of] = False
    tokens = tuple(int(weights[m[later[m]]].sum()) for m in members)
    leads = lengths < depth
    leads[group_first] = True
    return Split(depth, len(groups), first_of, tuple(members), tokens, int(weights[first_of].sum()),
                 int(weights.sum()), leads)


def splits(config) -> bool:
    """Whether a replay of ``config`` (:class:`~kvcli.replay.results.ReplayConfig`) can split its requests: one
    store (one chunk size, one layout), unlimited capacity (an LRU's order is the whole trace's) and no read
    namespace (what it supplies does not depend on the run's own order). A trace with measured requests, or on a
    server that will evict keys, is replayed whole all the same (:func:`split_trace`'s caller checks)."""
    return (len(config.chunk_sizes) == 1 and len(config.layouts) == 1 and not config.capacity_tokens
            and not config.capacity_bytes and config.namespace is None)


def split_trace(reader: Callable[[], Iterable[Request]], lengths: np.ndarray, chunker: PromptChunker,
                parts: int) -> Split | None:
    """:func:`plan_split` of the trace ``reader()`` gives (arrival order, ``lengths`` its prompt tokens) at
    ``chunker``'s chunk size into at most ``parts`` parts: the parent's pass over the prompts' heads
    (:func:`read_heads`), with the requests it kept. Raises what the reader raises."""
    heads, kept = read_heads(reader(), len(lengths), chunker)
    split = plan_split(heads, lengths, parts)
    return None if split is None else dataclasses.replace(split, kept=kept)


def replay_split(replayer, units, work: Work, split: Split, stores: list[KVStore],
                 progress: Callable[[int, int], None] | None) -> list[Part]:
    """Replay ``split``: the requests it replays first in this process (``replayer.replay_unit`` on ``stores``, the
    one store), then its parts at once on ``units`` (:class:`~kvcli.replay.parallel.ProcessUnits` or
    ``RayUnits``); the parts in that order. Each part's radix tree holds its own requests (with the upper bound),
    and each records its requests' chunk hashes where the store keeps a curve (:func:`finish_split`)."""
    count = len(work.lengths)
    config = replayer.config
    record = curve_of(config, stores[0]) is not None
    here = work if split.kept is None else dataclasses.replace(work, reader=functools.partial(iter, split.kept))
    done: list[Part] = []
    if len(split.first):
        first = np.zeros(count, bool)
        first[split.first] = True
        done.append(replayer.replay_unit(here, (0,), False, stores, progress,
                                         Share(first, None, int(split.first[-1]) + 1, record)))
    plan = []
    for k, members in enumerate(split.parts):
        replay = np.zeros(count, bool)
        replay[split.replayed(k)] = True
        radix = heads = None
        if config.upper_bound:
            radix = np.zeros(count, bool)
            radix[members] = True
            heads = split.leads & ~radix
        plan.append(((0,), config.upper_bound,
                     Share(replay, radix, None, record, heads, split.depth * stores[0].config.chunk_size)))
    return done + units.run(replayer, work, progress, plan, here)


def finish_split(parts: list[Part], result: ChunkSizeResult, store: KVStore, client, config,
                 lengths: np.ndarray) -> list[str]:
    """Complete the merged ``result`` of a split replay as one process's lane completes its own
    (:meth:`kvcli.replay.lane.Lane.finish`): the hit curve (and the planner) fed the parts' recorded chunk hashes in
    arrival order, and the store's Redis memory sampled once. Returns what could not be read, for the notes."""
    curve = curve_of(config, store)
    if curve is not None:
        rows = sorted((i, h, t) for p in parts if p.stream is not None and p.replayed is not None
                      for i, (h, t) in zip(p.replayed.tolist(), p.stream))
        for k in range(0, len(rows), CURVE_BATCH):
            curve.defer([([h[j:j + 16] for j in range(0, len(h), 16)], t, int(lengths[i]))
                         for i, h, t in rows[k:k + CURVE_BATCH]])
        curve_figures(curve, result, store, config.plan)
    return store_memory(client, store, result, config)


CURVE_BATCH = 256  # requests fed to the curve at a time (their hashes split into one bytes object each meanwhile)
