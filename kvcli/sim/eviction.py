"""Eviction policies beside LRU on one chunk size's requests, one cache of ``C`` chunks: LFU and S3-FIFO from
libCacheSim (its Python bindings, ``pip install 'kvcli[policies]'``; Yang et al., "FIFO queues are all you need
for cache eviction", SOSP 2023, for S3-FIFO), LRU from libCacheSim too, as a check of the wrapping: it equals the
replay's own :class:`~kvcli.sim.lru.ChunkLru` chunk for chunk (tests/sim/test_eviction.py).

The prefix rule on top, said: libCacheSim knows objects, not chains. Per request: the lookup asks the cache,
without updating it (``find(update_cache=False)``), for chunk 0, 1, ... and stops at the first miss: those are the
hits (a chunk held past a missing one is not usable, as in every prefix cache). Then every chunk of the request is
accessed (``get``: a hit updates the policy's state, a miss inserts, evicting as the policy does), last chunk first,
the order the replay's LRU touches them, so LRU keeps a chain's head longest. A chunk is one object of size 1.
libCacheSim evicts as each chunk goes in, the replay's LRU after the whole request: the same contents after every
request (so the same hits), but a held chunk of the request not reached yet can be evicted and written again, so
the policies' written chunks can exceed the replay LRU's (a small cache, long requests).

S3-FIFO needs at least 20 chunks: its small FIFO is 10% of the cache, libCacheSim aborts the process when that
rounds to 0 (under 10 chunks), and a small FIFO of 1 chunk (10 to 19) keeps nothing, so the cache holds nothing
at all (every access a miss; measured with libcachesim 0.3.5, tests/sim/test_eviction.py). Under 20 it is not run,
and said (:data:`S3FIFO_MIN_CHUNKS`).
"""
from __future__ import annotations

from dataclasses import dataclass

from kvcli.errors import BadInputError
from kvcli.sim.stream import ChunkStream

POLICIES = ("lru", "lfu", "s3fifo")
"""Policy names ``--policy`` takes."""
S3FIFO_MIN_CHUNKS = 20
"""The smallest capacity (chunks) at which libCacheSim's S3-FIFO holds anything (module docstring)."""


@dataclass(frozen=True)
class PolicyCounts:
    """One policy's counts at one capacity: hit chunks, whole-prompt hits (one token less each), chunks written
    (inserted); ``skipped``: why it did not run ("" when it did)."""

    policy: str
    capacity_chunks: int
    hit_chunks: int = 0
    whole_hits: int = 0
    written_chunks: int = 0
    skipped: str = ""

    def hit_tokens(self, chunk_size: int) -> int:
        """Hit tokens at ``chunk_size`` tokens per chunk."""
        return self.hit_chunks * chunk_size - self.whole_hits


def parse_policies(text: str | None) -> tuple[str, ...]:
    """``"lfu,s3fifo"`` -> ``("lru", "lfu", "s3fifo")`` (LRU always first: the baseline). Raises BadInputError
    naming --policy for an unknown name, listing the known ones."""
    if text is None:
        return ()
    names = [p.strip().lower().replace("-", "") for p in text.split(",") if p.strip()]
    bad = [n for n in names if n not in POLICIES]
    if bad or not names:
        raise BadInputError(f"--policy: unknown policy {', '.join(bad) or repr(text)}; known: {', '.join(POLICIES)}")
    return tuple(dict.fromkeys(["lru", *names]))


def libcachesim():
    """libCacheSim's module, imported (the policies' simulator; checked before a replay that asks for them, so a
    missing one stops it before any work).

    Raises:
        BadInputError: libCacheSim is not installed (naming --policy and how to install it).
    """
    try:
        import libcachesim as lcs
    except ImportError:
        raise BadInputError("--policy needs libCacheSim: pip install 'kvcli[policies]'") from None
    return lcs


def _cache(policy: str, capacity: int):
    """A libCacheSim cache of ``capacity`` objects. Raises BadInputError when libCacheSim is not installed."""
    lcs = libcachesim()
    factory = {"lru": lcs.LRU, "lfu": lcs.LFU, "s3fifo": lcs.S3FIFO}[policy]
    # the hash table: 2**hashpower buckets (libCacheSim's default 24 is 128 MiB per cache)
    return factory(cache_size=capacity, hashpower=max(10, min(24, (2 * capacity).bit_length()))), lcs.Request()


def simulate_policy(stream: ChunkStream, policy: str, capacity: int) -> PolicyCounts:
    """Run ``policy`` (one of :data:`POLICIES`) at ``capacity`` chunks over ``stream`` (module docstring); S3-FIFO
    below :data:`S3FIFO_MIN_CHUNKS` is not run: its counts are 0 and ``skipped`` says why, in one line.

    Raises:
        BadInputError: libCacheSim is not installed. ValueError: an unknown policy or a negative capacity.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0 chunks, got {capacity}")
    if capacity == 0:
        return PolicyCounts(policy, 0)
    if policy == "s3fifo" and capacity < S3FIFO_MIN_CHUNKS:
        return PolicyCounts(policy, capacity, skipped=(
            f"not run: S3-FIFO holds nothing below {S3FIFO_MIN_CHUNKS} chunks (libCacheSim's small FIFO, 10% of "
            f"the cache, keeps nothing under 2)"))
    cache, req = _cache(policy, capacity)
    req.obj_size = 1
    find, get = cache.find, cache.get
    flat, cuts, _ = stream.lists()
    whole_len = stream.whole().tolist()
    hits = whole = written = 0
    for r in range(len(whole_len)):
        h = flat[cuts[r]:cuts[r + 1]]
        k = 0
        for x in h:
            req.obj_id = x
            if find(req, False) is None:
                break
            k += 1
        hits += k
        whole += k == len(h) and whole_len[r]
        for x in reversed(h):
            req.obj_id = x
            written += not get(req)
    return PolicyCounts(policy, capacity, hits, int(whole), written)
