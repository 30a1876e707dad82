"""Routing policies: which node serves a request. A registry maps each name to a factory.

Interface (:class:`Policy`; the simulator in :mod:`kvcli.route.simulator` calls it):

* ``lookup(request) -> Lookup | None`` at arrival: only a policy that asks a cache manager returns a
  :class:`~kvcli.route.simulator.Lookup` (the router then waits ``wait_s`` simulated seconds); it may do real I/O.
* ``choose(request, view, lookup) -> node`` at dispatch; ``view`` (:class:`~kvcli.route.simulator.ClusterView`) gives
  each node's outstanding requests and prefill tokens. May mutate the policy's own state (counters, router index).
* ``on_cache_change(node, stored, evicted)`` after a node's prefill changed its cache (the cache manager's feed;
  chunk ids, :attr:`~kvcli.route.simulator.SimRequest.chunk_ids`).
* ``mirror_nodes(capacity_chunks) -> [deque per node] | None`` once, before the first request: a policy whose index
  predicts the nodes' caches exactly hands over its evictions, so the event loop keeps no second LRU (below).
* ``close()`` at the end (drops the cache manager's keys).

Load measures and ties: "least loaded" means fewest outstanding prefill tokens, then fewest outstanding requests,
then the lowest node number; ``cache-aware`` counts load in outstanding requests (as the SGLang router does), then
prefill tokens, then node number. The router-side index of ``prefix``, ``cache-aware`` and ``cost`` is fed by the
router's own decisions (it assumes a node caches what it was sent, at once) and mirrors each node's capacity with
its own LRU, so it can be wrong: it never hears of a real eviction, nor of a chunk still being prefilled. It is
early, not otherwise wrong: each node stores the requests sent to it in the order they were sent, so the index's
LRU ``k`` and node ``k``'s evict the same chunks at each store, and the nodes' caches replay the index's
evictions instead of running the same LRU again (:meth:`Policy.mirror_nodes`; on the Mooncake sample that takes
``prefix`` from about 115k to 150k simulated requests/s).
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvcli.errors import BadInputError, KvcliError
from kvcli.route.cachemanager import CacheManagerIndex
from kvcli.route.nodecache import ChunkIndex
from kvcli.route.simulator import STREAM_LOOKUP, STREAM_POLICY, ClusterView, Lookup, SimConfig, SimRequest
from kvcli.store.preflight import evicted_since, server_memory


def _least(first: list, second: list, nodes: list[int] | None) -> int:
    """The node ``k`` of ``nodes`` (default all) with the least ``(first[k], second[k], k)``. The common case, one
    node alone at the least ``first``, costs two C-level passes (``min``, ``count``) and no tuples."""
    if nodes is None:
        low = min(first)
        if first.count(low) == 1:
            return first.index(low)
        return min([(second[k], k) for k, v in enumerate(first) if v == low])[1]
    return nodes[0] if len(nodes) == 1 else min([(first[k], second[k], k) for k in nodes])[2]


def least_loaded(view: ClusterView, nodes: list[int] | None = None) -> int:
    """The node of ``nodes`` (default all) with the fewest outstanding prefill tokens, then requests, then number."""
    return _least(view.load_tokens, view.load_requests, nodes)


def fewest_requests(view: ClusterView, nodes: list[int] | None = None) -> int:
    """The node of ``nodes`` (default all) with the fewest outstanding requests, then prefill tokens, then number."""
    return _least(view.load_requests, view.load_tokens, nodes)


def best_matches(depths: list[int]) -> tuple[int, list[int]]:
    """(longest depth, the nodes that have it)."""
    best = max(depths)
    return best, [k for k, d in enumerate(depths) if d == best]


class Draws:
    """Random numbers handed out one at a time, drawn ``block`` at a time by ``draw(size) -> array``: the same
    values in the same order as one draw per call, for numpy's ``Generator.random`` and ``Generator.integers``
    (both take the bit generator's output value by value, whatever the size; tests/route pins it)."""

    def __init__(self, draw: Callable[[int], np.ndarray], block: int = 1024) -> None:
        self.draw, self.block, self.values = draw, block, iter(())

    def next(self):
        """The next value (a Python int or float)."""
        value = next(self.values, None)
        if value is None:
            self.values = iter(self.draw(self.block).tolist())
            value = next(self.values)
        return value


class Policy:
    """Base: no lookup, no reaction to cache changes, nothing to close. Subclasses implement :meth:`choose`.

    ``looks_up`` / ``watches_cache``: whether :meth:`lookup` / :meth:`on_cache_change` do anything; the event loop
    skips the calls when False (a subclass that overrides one sets its flag True)."""

    name = ""
    looks_up = False
    watches_cache = False

    def lookup(self, request: SimRequest) -> Lookup | None:
        return None

    def choose(self, request: SimRequest, view: ClusterView, lookup: Lookup | None) -> int:
        raise NotImplementedError

    def on_cache_change(self, node: int, stored: list[bytes], evicted: list[bytes]) -> None:
        pass

    def mirror_nodes(self, capacity_chunks: int | None) -> list[deque] | None:
        """None, or (a policy whose index mirrors the nodes' caches exactly) one queue per node of
        ``(depth, evicted)`` per decision sent to it, oldest first, kept from now on: ``depth`` the request's leading
        chunks the index held on that node before the decision's store (an int, chunks), ``evicted`` the chunk ids
        that store evicted (a list). The event loop then keeps no LRU of its own and reads a request's hit from
        ``depth`` (:mod:`kvcli.route.engine`)."""
        return None

    def close(self) -> None:
        pass

    def stats(self) -> dict:
        """Extra figures for the report's ``lookups`` block (none by default)."""
        return {}


class RoundRobin(Policy):
    """Node after node, in turn, whatever their caches and load."""

    name = "round-robin"

    def __init__(self, config: SimConfig) -> None:
        self.nodes, self.next = config.nodes, 0

    def choose(self, request, view, lookup) -> int:
        node, self.next = self.next, (self.next + 1) % self.nodes
        return node


class Random(Policy):
    """Uniform over nodes, from stream ``STREAM_POLICY`` of the seed."""

    name = "random"

    def __init__(self, config: SimConfig) -> None:
        rng = np.random.default_rng([config.seed, STREAM_POLICY])
        self.draws = Draws(lambda size: rng.integers(config.nodes, size=size))

    def choose(self, request, view, lookup) -> int:
        return self.draws.next()


class LeastLoaded(Policy):
    """The node with the fewest outstanding prefill tokens, then requests, then number (:func:`least_loaded`),
    whatever its cache."""

    name = "least-loaded"

    def __init__(self, config: SimConfig) -> None:
        pass

    def choose(self, request, view, lookup) -> int:
        return least_loaded(view)


class _RouterIndexed(Policy):
    """A policy with the router's own prefix index, fed by its own decisions (the notes' first design)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.index = ChunkIndex(config.nodes, config.capacity_chunks)
        self.depths, self.touches = self.index.depths, self.index.touches
        self.evictions: list[deque] | None = None  # per node, (depth, evicted) per decision when mirrored

    def choose(self, request, view, lookup) -> int:
        chunk_ids = request.chunk_ids
        depths = self.depths(chunk_ids)
        node = self.pick(request, view, depths)
        evicted = self.touches[node](chunk_ids)
        if self.evictions is not None:
            self.evictions[node].append((depths[node], evicted))
        return node

    def mirror_nodes(self, capacity_chunks: int | None) -> list[deque] | None:
        """The index's depth and evictions per decision, per node, from now on, when its capacity is the nodes'
        (else None).

        Why that mirrors the nodes exactly: a node prefills one request at a time, in the order they were sent to
        it (a FIFO queue), and stores it when the prefill ends; the index stores it when it is sent. So node ``k``'s
        cache and the index's cache ``k`` are fed the same requests in the same order, at the same capacity, and
        evict the same chunks at each store: the node's is only later. The node can then hold its chunks in an
        unlimited cache and drop, at each store, what the index evicted at the same store. For the same reason, when
        a request's prefill starts (every request sent to the node before it has been stored), the node's cache is
        the index's just before that request's store: its hit is the ``depth`` recorded then, no prefix match."""
        self.evictions = None
        if capacity_chunks != self.config.capacity_chunks or any(len(cache) for cache in self.index.caches):
            return None  # another capacity, or the index already holds decisions these nodes have not seen
        self.evictions = [deque() for _ in range(self.config.nodes)]
        return self.evictions

    def pick(self, request: SimRequest, view: ClusterView, depths: list[int]) -> int:
        raise NotImplementedError


class Prefix(_RouterIndexed):
    """Longest prefix match in the router's index wins; ties (and no match at all) go to the least loaded."""

    name = "prefix"

    def pick(self, request, view, depths) -> int:
        best = max(depths)
        if best == 0:  # no match: every node ties
            return least_loaded(view)
        return depths.index(best) if depths.count(best) == 1 else least_loaded(view, best_matches(depths)[1])


class CacheAware(_RouterIndexed):
    """SGLang router's cache-aware policy: if ``max - min > abs_threshold`` and ``max > rel_threshold * min``
    (outstanding requests), the node with the fewest requests; else the best prefix match if its match ratio
    (matched tokens / prompt tokens) is above ``cache_threshold`` (ties: fewest requests), else the fewest requests.
    (SGLang's last case picks the worker with the smallest tree; here it is the least loaded.)"""

    name = "cache-aware"

    def pick(self, request, view, depths) -> int:
        c, loads = self.config, view.load_requests
        high, low = max(loads), min(loads)
        if high - low > c.abs_threshold and high > c.rel_threshold * low:
            return fewest_requests(view)
        best = max(depths)
        ratio = best * c.chunk_size / request.prompt_tokens if request.prompt_tokens else 0.0
        if ratio > c.cache_threshold:
            return depths.index(best) if depths.count(best) == 1 else fewest_requests(view, best_matches(depths)[1])
        return fewest_requests(view)


class Cost(_RouterIndexed):
    """Score each node ``w * (tokens it would prefill) + (its outstanding prefill tokens)``; the lowest wins (ties:
    least loaded). With ``temperature`` T > 0 (tokens), sample node k with probability proportional to
    ``exp(-(score_k - min score) / T)`` from stream ``STREAM_POLICY``."""

    name = "cost"

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        rng = np.random.default_rng([config.seed, STREAM_POLICY])
        self.uniform = Draws(lambda size: rng.random(size))

    def pick(self, request, view, depths) -> int:
        c, prompt = self.config, request.prompt_tokens
        w, size = c.cost_weight, c.chunk_size
        scores = [w * (prompt - d * size) + load for d, load in zip(depths, view.load_tokens)]
        low = min(scores)
        if c.temperature == 0:
            if scores.count(low) == 1:
                return scores.index(low)
            return least_loaded(view, [k for k, s in enumerate(scores) if s == low])
        # Running sum left to right, as np.cumsum; bisect_right is np.searchsorted(side="right").
        weights = list(itertools.accumulate(math.exp(-(s - low) / c.temperature) for s in scores))
        return bisect.bisect_right(weights, self.uniform.next() * weights[-1])


class CacheManager(Policy):
    """Ask the Redis cache manager (:class:`~kvcli.route.cachemanager.CacheManagerIndex`) which node holds the longest
    prefix, after an injected delay (stream ``STREAM_LOOKUP``). If the wait (injected + measured, the measured part
    only when ``count_measured_latency``) exceeds ``lookup_timeout``, the router waits the timeout and sends the
    request to the least loaded node. Ties and no match at all: least loaded."""

    name = "cache-manager"
    looks_up = watches_cache = True

    def __init__(self, config: SimConfig, redis_client) -> None:
        if redis_client is None:
            raise KvcliError("the cache-manager policy needs a Redis server (--redis-url, or the embedded one)")
        self.config = config
        self.index = CacheManagerIndex(redis_client, config.nodes)
        self.memory = server_memory(redis_client)  # its evicted_keys: did the server evict the index meanwhile?
        self.rng = np.random.default_rng([config.seed, STREAM_LOOKUP])
        self.hash_of: list[bytes] = []  # chunk id -> hash (ChunkNumbering.hashes)

    def lookup(self, request) -> Lookup:
        c = self.config
        injected = c.lookup_delay.sample(self.rng)
        self.hash_of = request.numbering.hashes  # the same for every request of a simulation
        depths, measured = self.index.query(request.hashes)
        wait = injected + (measured if c.count_measured_latency else 0.0)
        if c.lookup_timeout is not None and wait > c.lookup_timeout:
            return Lookup(None, injected, measured, c.lookup_timeout, True)
        return Lookup(depths, injected, measured, wait, False)

    def choose(self, request, view, lookup) -> int:
        if lookup is None or lookup.depths is None:
            return least_loaded(view)
        return least_loaded(view, best_matches(lookup.depths)[1])

    def on_cache_change(self, node, stored, evicted) -> None:
        hash_of = self.hash_of
        self.index.publish(node, [hash_of[c] for c in stored], [hash_of[c] for c in evicted])

    def stats(self) -> dict:
        """Round trips to the manager: ``query_round_trips`` (lookups) and ``index_writes`` (node updates); and
        ``server_evicted_keys``, the keys the server evicted since the policy was made (whoever's: an evicted index
        key answers a lookup as a miss), None when INFO cannot be read."""
        return {"query_round_trips": self.index.queries, "index_writes": self.index.writes,
                "server_evicted_keys": evicted_since(self.index.client, self.memory)}

    def close(self) -> None:
        self.index.drop()


# SimConfig fields that change every policy's run: the cluster, the workload and the arrivals (``seed`` joins them
# when ``rate`` draws Poisson arrivals; see :func:`config_fields`).
COMMON_FIELDS = ("nodes", "capacity_tokens", "chunk_size", "max_batch", "decode_tpot", "default_output_tokens",
                 "rate", "first_tier", "lower_tiers")


def _never(config: SimConfig) -> bool:
    return False


@dataclass(frozen=True)
class PolicySpec:
    """A registry entry: ``factory(config, redis_client) -> Policy``; ``needs_redis`` says whether it uses Redis.
    ``reads``: the SimConfig fields besides :data:`COMMON_FIELDS` that change its run; ``seeded(config)``: whether it
    draws random numbers at ``config`` (then ``seed`` changes its run)."""

    name: str
    factory: Callable[[SimConfig, object], Policy]
    needs_redis: bool = False
    reads: tuple[str, ...] = ()
    seeded: Callable[[SimConfig], bool] = _never


POLICIES: dict[str, PolicySpec] = {s.name: s for s in (
    PolicySpec("round-robin", lambda c, r: RoundRobin(c)),
    PolicySpec("least-loaded", lambda c, r: LeastLoaded(c)),
    PolicySpec("random", lambda c, r: Random(c), seeded=lambda c: True),
    PolicySpec("prefix", lambda c, r: Prefix(c)),
    PolicySpec("cache-manager", CacheManager, needs_redis=True,
               reads=("lookup_delay", "lookup_timeout", "count_measured_latency"),
               seeded=lambda c: c.lookup_delay.kind != "fixed"),
    PolicySpec("cache-aware", lambda c, r: CacheAware(c), reads=("abs_threshold", "rel_threshold", "cache_threshold")),
    PolicySpec("cost", lambda c, r: Cost(c), reads=("cost_weight", "temperature"),
               seeded=lambda c: c.temperature > 0),
)}


def config_fields(name: str, config: SimConfig) -> tuple[str, ...]:
    """The SimConfig fields a run of policy ``name`` at ``config`` depends on: two configs that agree on these give
    the same run (so a sweep runs it once). :data:`COMMON_FIELDS`, the policy's ``reads``, and ``seed`` when
    arrivals are Poisson (``rate``) or the policy draws random numbers at ``config``."""
    spec = POLICIES[name]
    seed = ("seed",) if config.rate is not None or spec.seeded(config) else ()
    return COMMON_FIELDS + spec.reads + seed


def resolve_policies(names) -> list[str]:
    """Policy names from options (``["prefix", "cost"]``, ``["prefix,cost"]``, ``["all"]``), deduplicated, in the
    given order (``all``: registry order). Raises BadInputError on an unknown name, listing the valid ones."""
    out: list[str] = []
    for part in (p.strip() for n in names for p in n.split(",")):
        for name in (POLICIES if part == "all" else [part]):
            if name not in POLICIES:
                raise BadInputError(f"unknown policy {name!r}; valid: all, {', '.join(POLICIES)}")
            if name not in out:
                out.append(name)
    if not out:
        raise BadInputError(f"no policy given; valid: all, {', '.join(POLICIES)}")
    return out


def make_policy(name: str, config: SimConfig, redis_client=None) -> Policy:
    """A fresh policy called ``name``. Raises BadInputError listing the valid names; KvcliError if it needs Redis
    and ``redis_client`` is None; RedisFailure if Redis refuses."""
    if name not in POLICIES:
        raise BadInputError(f"unknown policy {name!r}; valid: all, {', '.join(POLICIES)}")
    return POLICIES[name].factory(config, redis_client)
