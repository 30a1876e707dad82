"""Cache tiers (``--tier NAME=SIZE``, fastest first) and the one mechanism that looks a request up in them and
writes it back: used by the replay's hierarchy on one node (:mod:`kvcli.replay.tiers`, whose docstring and
docs/planner.md "The tier model" state the model) and by the routing simulation's per-node and shared tiers
(:mod:`kvcli.route.engine`).

The tiers are :class:`~kvcli.store.lru.ChunkLru` objects in lookup order. A lookup's *bounds* are ``[tiers + 1]``
chunk indexes: tier ``i`` was asked from ``bounds[i]`` and served ``bounds[i + 1] - bounds[i]`` chunks;
``bounds[-1]`` is where the hit run ends. Cost per request of ``c`` chunks over ``m`` tiers: O(c + m) lookups for
the lookup, O(m * c + e) for the write (``e`` evictions).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcli.errors import BadInputError
from kvcli.store.lru import ChunkLru
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
