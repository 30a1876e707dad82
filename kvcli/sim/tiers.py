"""Cache tiers (``--tier NAME=SIZE``, fastest first): their specs, the one mechanism that looks a request up in
them and writes it back, and a hierarchy of them simulated over one chunk size's requests (:func:`simulate_tiers`,
the replay's planner). The routing simulation's per-node and shared tiers (:mod:`kvcli.route.engine`) use the same
lookup and write (:func:`lookup_tiers`, :func:`write_tiers`).

The tiers are :class:`~kvcli.sim.lru.ChunkLru` objects in lookup order. A lookup's *bounds* are ``[tiers + 1]``
chunk indexes: tier ``i`` was asked from ``bounds[i]`` and served ``bounds[i + 1] - bounds[i]`` chunks;
``bounds[-1]`` is where the hit run ends. Cost per request of ``c`` chunks over ``m`` tiers: O(c + m) lookups for
the lookup, O(m * c + e) for the write (``e`` evictions).

The model (one serving node; each tier its own :class:`~kvcli.sim.lru.ChunkLru`, the replay's one LRU with its
deepest-first touch order; docs/planner.md "The tier model"):

- Lookup, tier by tier in prefix order: tier 1 serves the longest run of the request's chunks it holds from chunk
  0; the run continues in tier 2 from the first chunk tier 1 missed, and so on; the request's hit run ends where
  the last tier misses. (LMCache's ``StorageManager`` looks its backends up this way, each from where the one
  before it stopped.) A tier is never asked again for chunks past a slower tier's run.
- Promotion: a chunk served by a slower tier is copied into every faster tier (LMCache writes a remote hit into its
  local CPU backend; vLLM loads an offloaded block back into the GPU's prefix cache).
- Write-through: every newly computed chunk is written to every tier (LMCache stores to each configured backend).
  With ``admit_after`` N, a new chunk is written only from its N-th request on (the requests holding it, this one
  included); a chunk's count never exceeds its prefix's, so the admitted new chunks are a run from the hit run's end.
- Touches: tier ``i`` touches (``ChunkLru.store``) the request's chunks from where its lookup started to the end of
  what is kept: its own hits, the promoted chunks and the new ones. Chunks a faster tier served are not touched in
  it (the engine never asks it for them), so the tiers' contents are not nested in general.

Where engines differ: vLLM's CPU offloading (``OffloadingConnector``) and SGLang HiCache keep the host tier as a
store of what the GPU evicts or writes back rather than write-through at compute time (HiCache's default
``write_through`` policy does write through; ``write_back`` writes on eviction); an engine whose host tier only
takes GPU evictions holds fewer duplicates, so this model's host tier is the conservative one for capacity.

One tier equals the replay's LRU at that capacity, chunk for chunk (the same ``ChunkLru``, fed the same requests).
Hit tokens follow the replay's rule: a prompt made only of full chunks that hits them all reuses one token less
(the engine computes the last token); that token is taken from the tier that served the last chunk.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kvcli.errors import BadInputError
from kvcli.sim.lru import ChunkLru
from kvcli.sim.stream import ChunkStream
from kvcli.units import parse_capacity

KINDS = {"gpu": "gpu", "hbm": "gpu", "host": "host", "cpu": "host", "dram": "host"}
"""Tier names with a known place (and price of a load); any other name (``redis``, ``valkey``, ``shared``...) is a
store across the network, loaded as the replay's Redis is."""


@dataclass(frozen=True)
class TierSpec:
    """One ``--tier NAME=SIZE``: a name and a size in tokens or in bytes of the model's KV (exactly one is set)."""

    name: str
    tokens: int | None = None
    bytes: int | None = None

    @property
    def kind(self) -> str:
        """"gpu", "host" or "remote" (:data:`KINDS`)."""
        return KINDS.get(self.name.lower(), "remote")

    def chunks(self, chunk_size: int, payload_bytes_per_chunk: int) -> int:
        """Capacity in whole chunks at this chunk size (tokens // chunk_size, or bytes // payload bytes per chunk)."""
        if self.bytes is not None:
            return self.bytes // max(payload_bytes_per_chunk, 1)
        assert self.tokens is not None
        return self.tokens // chunk_size

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"name": self.name, "kind": self.kind, "size_tokens": self.tokens, "size_bytes": self.bytes}


MAX_NAME = 24  # characters of a tier name


def parse_tier(text: str) -> TierSpec:
    """``NAME=SIZE``: SIZE in tokens (``3M tokens``, ``250000``) or bytes of the model's KV (``80GB``, ``1TiB``),
    read by :func:`kvcli.units.parse_capacity` (the one size parser).

    Raises:
        BadInputError: no ``=``, an empty or odd name, an unreadable, zero or unlimited size (message names --tier).
    """
    name, sep, size = text.partition("=")
    name = name.strip()
    if not sep or not name or not all(c.isalnum() or c in "-_" for c in name):
        raise BadInputError(f"--tier must be NAME=SIZE (e.g. gpu=40GB, host=2M tokens), got {text!r}")
    if len(name) > MAX_NAME:
        raise BadInputError(f"--tier {name}: a tier name has at most {MAX_NAME} characters (it labels report rows)")
    in_bytes = []

    def per_token() -> int:  # called by the parser only for a size in bytes: then it is kept in bytes
        in_bytes.append(True)
        return 1

    try:
        value = parse_capacity(size, per_token)
    except BadInputError as exc:
        raise BadInputError(f"--tier {name}: {exc}") from None
    if value is None or value <= 0:
        raise BadInputError(f"--tier {name}: the size must be a positive number of tokens or bytes, got {size!r}")
    return TierSpec(name, None, value) if in_bytes else TierSpec(name, value, None)


def check_tiers(tiers: Sequence[TierSpec]) -> None:
    """Raise BadInputError (naming --tier) when two tiers share a name (case aside), or when a node's own tier
    (``gpu``, ``host``... :data:`KINDS`) comes after a store across the network: tiers are looked up fastest first,
    so the node's memory cannot stand behind a shared store."""
    names = [t.name for t in tiers]
    if len({n.lower() for n in names}) != len(names):  # GPU and gpu: one tier named twice
        raise BadInputError(f"--tier names must differ, got {', '.join(names)}")
    late = next((b for a, b in zip(tiers, tiers[1:]) if a.kind == "remote" and b.kind != "remote"), None)
    if late is not None:
        raise BadInputError(f"--tier {late.name}: a per-node tier must come before the shared ones "
                            f"({', '.join(t.name for t in tiers if t.kind == 'remote')}); tiers are fastest first")


def check_tier_room(option: str, size: int, chunk_size: int, chunk_bytes: int | None = None) -> None:
    """Raise BadInputError unless a cache of ``size`` holds at least one chunk of ``chunk_size`` tokens: ``size``
    tokens, or with ``chunk_bytes`` (payload bytes per chunk) ``size`` bytes. A smaller one holds nothing, so it
    could only report misses; replay's ``--tier`` and route's ``--tier`` and ``--node-capacity`` are refused alike.

    Args:
        option: what the message names (``--tier gpu``, ``--node-capacity``).
    """
    if chunk_bytes is None and size < chunk_size:
        raise BadInputError(f"{option} must be at least one chunk (>= --chunk-size, {chunk_size:,} tokens), got "
                            f"{size:,}")
    if chunk_bytes is not None and size < chunk_bytes:
        raise BadInputError(f"{option} must be at least one chunk ({chunk_bytes:,} bytes of KV at chunk size "
                            f"{chunk_size}), got {size:,} bytes")


def check_tier_sizes(tiers: Sequence[TierSpec], chunk_size: int, chunk_bytes: int | None = None) -> None:
    """:func:`check_tier_room` for each tier at one chunk size of ``chunk_bytes`` payload bytes per chunk (None: not
    known yet, the tiers sized in bytes are not checked).

    Raises:
        BadInputError: the first tier smaller than one chunk, named.
    """
    for t in tiers:
        if t.tokens is not None:
            check_tier_room(f"--tier {t.name}", t.tokens, chunk_size)
        elif t.bytes is not None and chunk_bytes is not None:
            check_tier_room(f"--tier {t.name}", t.bytes, chunk_size, chunk_bytes)


def lookup_tiers(tiers: Sequence[ChunkLru], chunk_ids: Sequence, start: int = 0) -> list[int]:
    """Look ``chunk_ids`` (a request's, in prompt order) up tier by tier in prefix order, from chunk ``start``: each
    tier serves the longest run it holds from where the one before it stopped; a tier is not asked past the end.
    Nothing is touched. Returns the bounds (module docstring), ``[len(tiers) + 1]``, ``bounds[0] == start``."""
    n, p = len(chunk_ids), start
    bounds = [p]
    for tier in tiers:
        if p < n:
            p += tier.match(chunk_ids[p:] if p else chunk_ids)
        bounds.append(p)
    return bounds


def write_tiers(tiers: Sequence[ChunkLru], chunk_ids: Sequence, bounds: Sequence[int], end: int) -> list[int]:
    """Promotion and write-through after a lookup's ``bounds``: tier ``i`` stores (:meth:`ChunkLru.store`, the
    deepest-first touch) ``chunk_ids[bounds[i]:end]`` (its own hits, what slower tiers served, the new chunks up to
    ``end``, a chunk index); a tier asked at or past ``end`` is left alone, and so is a tier of capacity 0 (smaller
    than one chunk: it keeps, so writes, nothing). Returns the chunks new to each tier."""
    n, written = len(chunk_ids), []
    for tier, begin in zip(tiers, bounds):
        if begin < end and tier.capacity != 0:
            new, _ = tier.store(chunk_ids[begin:end] if begin or end < n else chunk_ids)
            written.append(len(new))
        else:
            written.append(0)
    return written


def served_tokens(bounds: Sequence[int], chunk_size: int, hit_tokens: int) -> list[int]:
    """Hit tokens each tier served, ``[len(bounds) - 1]``: its chunks times ``chunk_size``, less what the request's
    ``hit_tokens`` (its hit run in tokens, at most ``bounds[-1] * chunk_size``) falls short of the run, taken from
    the last tier that served a chunk (a whole-prompt hit reuses one token less: the engine computes the last)."""
    out = [(b - a) * chunk_size for a, b in zip(bounds, bounds[1:])]
    short = (bounds[-1] - bounds[0]) * chunk_size - hit_tokens
    if short:
        last = max(i for i, tokens in enumerate(out) if tokens)
        out[last] -= short
    return out



@dataclass(frozen=True)
class TierCounts:
    """What each tier did over a stream (lists in tier order, fastest first).

    Attributes:
        capacity_chunks: each tier's capacity in chunks.
        hit_chunks: chunks each tier served (they add up to the hierarchy's hit chunks).
        hit_tokens: tokens each tier served (``hit_chunks * chunk_size`` less one per whole-prompt hit whose last
            chunk it served); they add up to the hierarchy's hit tokens.
        hit_requests: requests that read at least one chunk from each tier.
        written_chunks: chunks written into each tier (new ones and promotions).
        admitted_new_chunks / new_chunks: newly computed chunks kept (written to the tiers) / computed, over the trace.
    """

    capacity_chunks: list[int]
    hit_chunks: list[int]
    hit_tokens: list[int]
    hit_requests: list[int]
    written_chunks: list[int]
    admitted_new_chunks: int
    new_chunks: int

    @property
    def total_hit_tokens(self) -> int:
        """The hierarchy's hit tokens."""
        return sum(self.hit_tokens)


def simulate_tiers(stream: ChunkStream, capacities: Sequence[int], admit_after: int = 1) -> TierCounts:
    """Replay ``stream`` through tiers of ``capacities`` chunks (fastest first; module docstring).

    Args:
        stream: one chunk size's requests as chunk ids.
        capacities: chunks per tier, each >= 0.
        admit_after: a new chunk is written to the tiers from its ``admit_after``-th request on (1: always).

    Raises:
        ValueError: no tier, a negative capacity or ``admit_after`` < 1.
    """
    if not capacities:
        raise ValueError("at least one tier")
    if admit_after < 1:
        raise ValueError(f"admit_after must be >= 1, got {admit_after}")
    lrus = [ChunkLru(c) for c in capacities]
    m, cs = len(lrus), stream.chunk_size
    hit, hit_tokens, hit_req, written = [0] * m, [0] * m, [0] * m, [0] * m
    seen: Counter | None = Counter() if admit_after > 1 else None
    new_total = admitted_total = 0
    flat, cuts, tokens = stream.lists()
    for r, n_tokens in enumerate(tokens):
        h = flat[cuts[r]:cuts[r + 1]]
        n = len(h)
        bounds = lookup_tiers(lrus, h)
        p = bounds[-1]
        if p:
            served = served_tokens(bounds, cs, p * cs - (p == n and n_tokens == n * cs))
            for i in range(m):
                k = bounds[i + 1] - bounds[i]
                if k:
                    hit[i] += k
                    hit_tokens[i] += served[i]
                    hit_req[i] += 1
        end = n
        if seen is not None:
            seen.update(h)
            end = p
            while end < n and seen[h[end]] >= admit_after:
                end += 1
        new_total += n - p
        admitted_total += end - p
        for i, w in enumerate(write_tiers(lrus, h, bounds, end)):
            written[i] += w
    return TierCounts(list(capacities), hit, hit_tokens, hit_req, written, admitted_total, new_total)
