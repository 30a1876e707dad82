"""KV-cache-aware routing, simulated: N serving nodes with LRU chunk caches, in a discrete-event loop.

The model (what ``kvcli route`` simulates; docs/routing.md says the same for users):

* **Requests** are hashed once (:func:`prepare_requests`): one 16-byte prefix-chained hash per *full* chunk
  (:mod:`kvcli.store.hashing`), the cache salt in the root, so two tenants never share a chunk.
* **Arrivals**: at the trace's timestamps (seconds), or Poisson at ``rate`` requests/s (seeded) with ``--rate``.
* **Routing**: at arrival the policy picks a node. A policy that asks a cache manager (``cache-manager``) first
  waits for its answer (``Lookup.wait_s``: injected delay + measured Redis latency, capped at the timeout); the
  request reaches the node after that wait.
* **Node** (one per ``nodes``): an LRU cache of ``capacity`` tokens (``capacity // chunk_size`` chunks), a FIFO
  queue and at most ``max_batch`` admitted requests (a slot is held from prefill start to the last output token).
  Prefill is serialized per node (one at a time, FIFO: prefill is compute-bound, so two at once take as long as
  one after the other); decodes of admitted requests overlap freely (memory-bound, batched).
* **Prefill** covers only the tokens not cached on that node at prefill start (the longest run of the request's
  chunks from chunk 0, less the last token when it covers the whole prompt: the engine computes that one,
  :func:`kvcli.store.hashing.reusable_tokens`): ``seconds = cost.seconds(prompt - hit, hit)``. At prefill end the
  first token is out and the node stores all the request's full chunks. **Decode** then takes ``(output_tokens - 1) *
  decode_tpot`` s.
* **Load** a node reports: outstanding requests (routed, not finished) and outstanding prefill tokens (tokens of
  routed requests whose prefill has not ended, counted without the tokens cached on the node when routed, then
  corrected to the true count at prefill start).
* At one instant, prefill ends come first, then decode ends, then dispatches, then arrivals (each in order).

Simulated time only: nothing sleeps. Per request the work is per chunk (LRU updates on int chunk ids), never per
token; the event loop is :mod:`kvcli.route.engine` (over 100,000 requests/s for the in-process policies,
docs/measurements.md).
"""
from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvcli.errors import BadInputError
from kvcli.route.cachemanager import DelaySpec
from kvcli.route.engine import EventLoop
from kvcli.sim.lru import ChunkLru
from kvcli.sim.numbering import ChunkNumbering
from kvcli.sim.tiers import check_tier_room, check_tiers, lookup_tiers, parse_tier, write_tiers
from kvcli.store.hashing import PromptChunker, reusable_tokens
from kvcli.units import check_count, check_seed, parse_capacity

# Independent random streams of one seed: np.random.default_rng([seed, stream]).
STREAM_ARRIVALS, STREAM_POLICY, STREAM_LOOKUP = 1, 2, 3
MAX_NODES = 100_000  # each node holds its own cache object: beyond this a typo, not a cluster


@dataclass(frozen=True)
class RouteTier:
    """A cache tier behind each node's first one (``--tier NAME=SIZE`` after the first).

    Attributes:
        name: as given. tokens: capacity in tokens (``tokens // chunk_size`` chunks).
        shared: one cache for the whole fleet (a Redis/Valkey store behind the nodes) instead of one per node.
    """

    name: str
    tokens: int
    shared: bool


def parse_route_tiers(texts: Sequence[str], kv_bytes_per_token: Callable[[], int]) -> tuple[str, int,
                                                                                             tuple[RouteTier, ...]]:
    """``--tier NAME=SIZE`` options (fastest first) for ``kvcli route``, read by
    :func:`kvcli.sim.tiers.parse_tier`: a name of kind ``gpu`` or ``host`` (:data:`kvcli.sim.tiers.KINDS`:
    gpu, hbm, host, cpu, dram) is one cache per node, any other name (``redis``, ``valkey``, ``shared``...) one
    cache shared by all nodes. The first tier is each node's own cache (what ``--node-capacity`` sizes without
    ``--tier``); shared tiers come after every per-node one. A size in bytes is divided by
    ``kv_bytes_per_token()`` (called only then), as ``--node-capacity``'s.

    Returns:
        (first tier's name, its size in tokens, the tiers behind it).

    Raises:
        BadInputError: no tier, a bad NAME=SIZE, two tiers of one name, a shared first tier, or a per-node tier
            after a shared one (the message names --tier).
    """
    specs = [parse_tier(t) for t in texts]
    if not specs:
        raise BadInputError("--tier: give at least one tier, e.g. --tier gpu=3M tokens")
    check_tiers(specs)
    tiers = [RouteTier(s.name, s.tokens if s.tokens is not None else (s.bytes or 0) // kv_bytes_per_token(),
                       s.kind == "remote") for s in specs]
    if tiers[0].shared:
        raise BadInputError(f"--tier {tiers[0].name}: the first tier is each node's own cache; name it gpu, hbm, "
                            "host, cpu or dram (other names are shared by all nodes)")
    return tiers[0].name, tiers[0].tokens, tuple(tiers[1:])


DEFAULT_NODE_CAPACITY = "3M tokens"


def node_cache_options(node_capacity: str | None, tiers: Sequence[str], kv_bytes_per_token: Callable[[], int]) -> dict:
    """The :class:`SimConfig` fields of the nodes' caches from ``--node-capacity`` (None: not given, then
    :data:`DEFAULT_NODE_CAPACITY`) or ``--tier`` options (:func:`parse_route_tiers`): ``capacity_tokens``,
    ``first_tier``, ``lower_tiers``. ``kv_bytes_per_token()`` is called only for a size in bytes.

    Raises:
        BadInputError: both options given (the first tier is the node cache ``--node-capacity`` sizes), or as
            :func:`kvcli.units.parse_capacity` and :func:`parse_route_tiers`.
    """
    if not tiers:
        return {"capacity_tokens": parse_capacity(node_capacity or DEFAULT_NODE_CAPACITY, kv_bytes_per_token)}
    if node_capacity is not None:
        raise BadInputError("--tier and --node-capacity both size each node's first cache: give one (--tier gpu=SIZE "
                            "for the first tier)")
    first, tokens, lower = parse_route_tiers(tiers, kv_bytes_per_token)
    return {"capacity_tokens": tokens, "first_tier": first, "lower_tiers": lower}


@dataclass(frozen=True)
class SimConfig:
    """Everything one simulation needs besides the trace, the policy and the cost curve. Built once at the CLI.

    Attributes:
        nodes: serving nodes. capacity_tokens: KV cache per node in tokens (None = unlimited).
        chunk_size: tokens per chunk (the hashing unit and the cache's granularity).
        max_batch: requests a node serves at once (prefill + decode); more wait in its FIFO queue.
        decode_tpot: seconds per output token after the first. default_output_tokens: for requests without one.
        rate: Poisson arrivals in requests/s instead of the trace's timestamps (None = timestamps). seed: all RNGs.
        abs_threshold, rel_threshold, cache_threshold: ``cache-aware`` (SGLang router's defaults 32, 1.0001, 0.5).
        cost_weight: ``cost``'s w. temperature: ``cost``'s softmax temperature in tokens (0 = argmin).
        lookup_delay: injected cache-manager delay. lookup_timeout: seconds, then least-loaded (None = wait).
        count_measured_latency: add the measured Redis round trip to the lookup wait (False: count it as 0, for
            exact, repeatable runs; it is still reported).
        first_tier: the name of each node's first cache tier (the one ``capacity_tokens`` sizes) when tiers are
            given (None: no tiers, no per-tier report). lower_tiers: the tiers behind it, in lookup order
            (:func:`parse_route_tiers`; the model is in docs/routing.md).
    """

    nodes: int = 4
    capacity_tokens: int | None = 3_000_000
    chunk_size: int = 256
    max_batch: int = 64
    decode_tpot: float = 0.02
    default_output_tokens: int = 128
    rate: float | None = None
    seed: int = 0
    abs_threshold: float = 32.0
    rel_threshold: float = 1.0001
    cache_threshold: float = 0.5
    cost_weight: float = 1.0
    temperature: float = 0.0
    lookup_delay: DelaySpec = field(default_factory=DelaySpec)
    lookup_timeout: float | None = None
    count_measured_latency: bool = True
    first_tier: str | None = None
    lower_tiers: tuple[RouteTier, ...] = ()

    def __post_init__(self) -> None:
        """Reject values no run can use, naming the CLI option: BadInputError."""
        if not isinstance(self.lookup_delay, DelaySpec):
            raise BadInputError(f"lookup_delay must be a DelaySpec, got {self.lookup_delay!r}")
        floats = {"--decode-tpot": self.decode_tpot, "--rate": self.rate, "--abs-threshold": self.abs_threshold,
                  "--rel-threshold": self.rel_threshold, "--cache-threshold": self.cache_threshold,
                  "--w": self.cost_weight, "--temperature": self.temperature, "--lookup-timeout": self.lookup_timeout}
        for option, value in floats.items():
            if value is not None and not math.isfinite(value):
                raise BadInputError(f"{option} must be a finite number, got {value}")
        check_seed(self.seed)
        capacity, chunk = self.capacity_tokens, self.chunk_size
        checks = [("--nodes", self.nodes, 1 <= self.nodes <= MAX_NODES, f"in [1, {MAX_NODES:,}] (one cache each)"),
                  ("--chunk-size", chunk, chunk >= 1, ">= 1"),
                  ("--max-batch", self.max_batch, self.max_batch >= 1, ">= 1"),
                  ("--decode-tpot", self.decode_tpot, self.decode_tpot >= 0, ">= 0"),
                  ("--output-length", self.default_output_tokens, self.default_output_tokens >= 0, ">= 0"),
                  ("--rate", self.rate, self.rate is None or self.rate > 0, "> 0"),
                  ("--abs-threshold", self.abs_threshold, self.abs_threshold >= 0, ">= 0"),
                  ("--rel-threshold", self.rel_threshold, self.rel_threshold >= 1, ">= 1 (below 1 it acts as 1)"),
                  ("--cache-threshold", self.cache_threshold, 0 <= self.cache_threshold <= 1, "in [0, 1]"),
                  ("--w", self.cost_weight, self.cost_weight >= 0, ">= 0"),
                  ("--temperature", self.temperature, self.temperature >= 0, ">= 0"),
                  ("--lookup-timeout", self.lookup_timeout, self.lookup_timeout is None or self.lookup_timeout > 0,
                   "> 0 seconds")]
        if self.lower_tiers and self.first_tier is None:
            raise BadInputError("lower_tiers need first_tier (the name of the tier capacity_tokens sizes)")
        for option, value, ok, requirement in checks:
            if not ok:
                shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"  # 100,000,000 nodes, not 1e+08
                raise BadInputError(f"{option} must be {requirement}, got {shown}")
        if capacity is not None:
            check_tier_room("--node-capacity" if self.first_tier is None else f"--tier {self.first_tier}", capacity,
                            chunk)
        for t in self.lower_tiers:
            check_tier_room(f"--tier {t.name}", t.tokens, chunk)

    @property
    def capacity_chunks(self) -> int | None:
        """Chunks a node's cache holds (None = unlimited)."""
        return None if self.capacity_tokens is None else self.capacity_tokens // self.chunk_size

    @property
    def tier_names(self) -> list[str]:
        """Every tier's name in lookup order (``[]`` without tiers)."""
        return [] if self.first_tier is None else [self.first_tier] + [t.name for t in self.lower_tiers]

    def lower_caches(self, nodes: int) -> list[list[ChunkLru]]:
        """Empty caches of :attr:`lower_tiers` for ``nodes`` nodes, ``[nodes][lower tiers]`` in lookup order: a
        per-node tier is a cache per node, a shared one the same cache in every node's list."""
        shared = {t.name: ChunkLru(t.tokens // self.chunk_size) for t in self.lower_tiers if t.shared}
        return [[shared[t.name] if t.shared else ChunkLru(t.tokens // self.chunk_size) for t in self.lower_tiers]
                for _ in range(nodes)]


@dataclass(frozen=True, slots=True)
class SimRequest:
    """A request as the simulator sees it: chunk ids instead of tokens (one int per chunk, not per token).

    Attributes:
        id: the trace's id. chunk_ids: one per full chunk, in prompt order (:mod:`kvcli.sim.numbering`).
        prompt_tokens: prompt length (tokens). output_length: tokens generated, or None (config default).
        timestamp: arrival in seconds, or None. cache_salt: tenant.
        source: ``"<file>:<line>"`` of the trace record, for error messages ("" when unknown).
        numbering: the trace's :class:`ChunkNumbering`; requests simulated together must share it, or one id
            could stand for two chunks (:func:`simulate` checks).
    """

    id: str
    chunk_ids: tuple[int, ...]
    prompt_tokens: int
    output_length: int | None
    timestamp: float | None
    cache_salt: str
    numbering: ChunkNumbering = field(repr=False, compare=False)
    source: str = field(default="", compare=False)

    @property
    def hashes(self) -> tuple[bytes, ...]:
        """16-byte chunk hashes, one per full chunk, chained from the salt's root (:mod:`kvcli.store.hashing`)."""
        table = self.numbering.hashes
        return tuple([table[c] for c in self.chunk_ids])


def prepare_requests(trace: Iterable, chunk_size: int, tokenizer: str = "") -> list[SimRequest]:
    """Hash every request of ``trace`` (kvcli.traces.Request objects) once, and number the distinct hashes (one
    :class:`ChunkNumbering` per call); the token arrays are not kept, and a hash-id request's are never made (its
    chunks are hashed from its block keys: :meth:`~kvcli.store.hashing.PromptChunker.hashes`).

    The root is the store's, of model ``"kvcli-route"``, ``tokenizer`` and the request's cache salt: only the salt
    varies inside one run, and it is what keeps tenants apart.
    """
    chunker = PromptChunker("kvcli-route", tokenizer, chunk_size)
    numbering, out = ChunkNumbering(), []
    for r in trace:
        chunk_ids = numbering.number(chunker.hashes(r.prompt, r.hash_salt)[0])
        out.append(SimRequest(r.id, chunk_ids, int(r.prompt_tokens), r.output_length, r.timestamp, r.cache_salt,
                              numbering, r.source))
    numbering.close()
    return out


def check_numbering(requests: list[SimRequest]) -> None:
    """ValueError unless all ``requests`` come from one :func:`prepare_requests` call (one chunk numbering)."""
    if len(set(map(operator.attrgetter("numbering"), requests))) > 1:  # compared by identity
        raise ValueError("requests from two prepare_requests calls cannot be simulated together: their chunk ids "
                         "are numbered apart; prepare them in one call")


def arrival_times(requests: list[SimRequest], rate: float | None, seed: int) -> np.ndarray:
    """Arrival time of each request, seconds ``[requests]``: Poisson at ``rate`` (first at 0, exponential gaps
    from stream ``STREAM_ARRIVALS``), else the trace's timestamps.

    Raises:
        BadInputError: no ``rate`` and a request without a timestamp.
    """
    if rate is not None:
        gaps = np.random.default_rng([seed, STREAM_ARRIVALS]).exponential(1.0 / rate, len(requests))
        return np.concatenate([[0.0], np.cumsum(gaps[1:])]) if len(requests) else gaps
    stamps = list(map(operator.attrgetter("timestamp"), requests))
    if None in stamps:
        missing = requests[stamps.index(None)]
        where = f"{missing.source}: " if missing.source else ""
        raise BadInputError(f"{where}request {missing.id} has no timestamp; pass --rate to use Poisson arrivals")
    return np.array(stamps, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Lookup:
    """A cache manager's answer to one request, as the router saw it.

    Attributes:
        depths: leading chunks cached per node ``[nodes]``, or None when the router gave up (timeout).
        injected_s: the injected delay. measured_s: the real Redis round trip (wall clock, seconds).
        wait_s: simulated seconds the router waited before dispatching. timed_out: wait hit the timeout.
    """

    depths: list[int] | None
    injected_s: float
    measured_s: float
    wait_s: float
    timed_out: bool


@dataclass
class ClusterView:
    """What a router sees of the nodes: per-node outstanding requests and prefill tokens (read-only to policies)."""

    load_tokens: list[int]
    load_requests: list[int]
    chunk_size: int


@dataclass(frozen=True)
class SimResult:
    """Per-request records of one simulation (arrays ``[requests]``; times in simulated seconds).

    ``ttft = first_token - arrival`` (includes the lookup wait), ``queue_wait = prefill_start - dispatch``,
    ``e2e = finish - arrival``. ``measured`` is the real Redis latency of each lookup, added to the wait only when
    ``count_measured_latency``; ``injected`` is the injected delay (both 0 without a lookup). ``hit_tokens_by_tier``:
    hit tokens each tier served over the run, ``[tiers]`` in lookup order, adding up to ``hit_tokens.sum()``
    (``[]`` without tiers).
    """

    policy: str
    nodes: int
    node: np.ndarray
    prompt_tokens: np.ndarray
    hit_tokens: np.ndarray
    arrival: np.ndarray
    dispatch: np.ndarray
    prefill_start: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    injected: np.ndarray
    measured: np.ndarray
    looked_up: np.ndarray
    timed_out: np.ndarray
    evictions: int
    peak_imbalance: int
    hit_tokens_by_tier: list[int] = field(default_factory=list)


def simulate(requests: list[SimRequest], policy, config: SimConfig, cost) -> SimResult:
    """Run ``requests`` through ``policy`` on ``config.nodes`` nodes in simulated time.

    Args:
        requests: from one :func:`prepare_requests` call (hashed with ``config.chunk_size``).
        policy: a :class:`kvcli.route.policies.Policy` (fresh: policies keep state).
        cost: a :class:`kvcli.model.costcurve.CostCurve` (its scalar ``seconds(new_tokens, cached_tokens)``).

    Raises:
        BadInputError: as :func:`arrival_times`. ValueError: as :func:`check_numbering`.
    """
    check_numbering(requests)
    arrival = arrival_times(requests, config.rate, config.seed)
    order = np.argsort(arrival, kind="stable")  # ties: trace order
    tpot, default = config.decode_tpot, config.default_output_tokens
    outputs = list(map(operator.attrgetter("output_length"), requests))
    if None in outputs:
        outputs = [default if o is None else o for o in outputs]
    zero = 0 * tpot  # max(o - 1, 0) * tpot, without a call per request
    decode = [(o - 1) * tpot if o > 1 else zero for o in outputs]
    view = ClusterView([0] * config.nodes, [0] * config.nodes, config.chunk_size)
    out = EventLoop(requests, list(zip(arrival[order].tolist(), order.tolist())), decode, policy, view,
                    config.capacity_chunks, config.max_batch, cost.seconds,
                    config.lower_caches(config.nodes) if config.first_tier is not None else None).run()
    times = {k: np.array(getattr(out, k), dtype=np.float64)
             for k in ("dispatch", "prefill_start", "first_token", "finish", "injected", "measured")}
    return SimResult(
        getattr(policy, "name", type(policy).__name__), config.nodes, node=np.array(out.node, dtype=np.int64),
        prompt_tokens=np.array(list(map(operator.attrgetter("prompt_tokens"), requests)), dtype=np.int64),
        hit_tokens=np.array(out.hit_tokens, dtype=np.int64), arrival=arrival, **times,
        looked_up=np.array(out.looked_up, dtype=bool), timed_out=np.array(out.timed_out, dtype=bool),
        evictions=out.evictions, peak_imbalance=out.peak_imbalance, hit_tokens_by_tier=out.hit_tokens_by_tier)


def single_node_hit_tokens(requests: list[SimRequest], config: SimConfig) -> int:
    """Hit tokens of one node holding the whole cluster's capacity (``nodes x capacity`` in each per-node tier, a
    shared tier's own size), serving every request in arrival order with no overlap, each looked up and stored at
    once (:func:`kvcli.sim.tiers.lookup_tiers`, :func:`~kvcli.sim.tiers.write_tiers`): the ceiling no routing
    policy can beat with the same total cache without tiers (LRU aside, by a hair); with tiers a reference only (a
    split cluster's nodes hold different chunks beside a shared tier: docs/routing.md, "Cache tiers")."""
    check_numbering(requests)
    capacity = None if config.capacity_chunks is None else config.capacity_chunks * config.nodes
    caches = [ChunkLru(capacity)] + [ChunkLru(t.tokens // config.chunk_size * (1 if t.shared else config.nodes))
                                     for t in config.lower_tiers]
    order = np.argsort(arrival_times(requests, config.rate, config.seed), kind="stable")
    hit = 0
    for i in order.tolist():
        chunk_ids = requests[i].chunk_ids
        bounds = lookup_tiers(caches, chunk_ids)
        hit += reusable_tokens(bounds[-1] * config.chunk_size, requests[i].prompt_tokens)
        write_tiers(caches, chunk_ids, bounds, len(chunk_ids))
    return hit


def kv_bytes_per_token(model: str) -> int:
    """KV bytes per token of a model preset or checkpoint folder in its default dtype (:mod:`kvcli.model.load`;
    imports torch). Raises BadInputError for an unknown preset or an unusable folder."""
    from kvcli.model.load import kv_bytes_per_token as per_token

    return per_token(model)


def load_requests(path, fmt: str = "auto", tokenizer="cl100k_base", chunk_size: int = 256,
                  limit: int | None = None, track=None) -> list[SimRequest]:
    """Read (:func:`kvcli.traces.read_trace`), cut to the first ``limit`` requests, and hash a trace.
    ``tokenizer``: a name, folder or loaded Tokenizer. ``track(iterable) -> iterable`` may wrap the stream for
    progress. Raises BadInputError (also on no requests, prompts that are all empty, or ``limit`` < 1)."""
    import itertools

    from kvcli.model.tokenize import lazy_tokenizer
    from kvcli.traces.detect import read_trace

    check_count("--limit", limit)
    tok, name = lazy_tokenizer(tokenizer)
    stream = itertools.islice(read_trace(path, fmt, tok), None if limit is None else min(limit, sys.maxsize))
    requests = prepare_requests(track(stream) if track else stream, chunk_size, name)
    if not requests:
        raise BadInputError("the trace has no requests", path=str(path))
    if not any(r.prompt_tokens for r in requests):  # no hit ratio, no prefill, no load to balance
        raise BadInputError(f"the trace's {len(requests):,} prompts are all empty: nothing to route", path=str(path))
    return requests


def check_prefill_tps(prefill_tps: float | None) -> None:
    """BadInputError unless ``prefill_tps`` is None or a finite number > 0."""
    if prefill_tps is not None and not (math.isfinite(prefill_tps) and prefill_tps > 0):
        raise BadInputError(f"--prefill-tps must be a finite number > 0, got {prefill_tps}")


def prefill_cost(prefill_tps: float | None, model: str = "cpu"):
    """The prefill cost curve: a flat ``prefill_tps`` tokens/s when given, else measured now on the local model
    (:func:`kvcli.model.costcurve.calibrate` on ``load_model(model)``, a preset or checkpoint folder; a few seconds on
    CPU).

    Returns:
        (CostCurve, JSON-ready description). Raises BadInputError, ModelFailure.
    """
    from kvcli.model.costcurve import CostCurve, calibrate

    if prefill_tps is not None:
        check_prefill_tps(prefill_tps)
        curve = CostCurve.from_tokens_per_second(prefill_tps)
        return curve, {"source": f"--prefill-tps {prefill_tps:g}", **curve.to_dict()}
    from kvcli.model.load import load_model

    local = load_model(model)
    curve = CostCurve.fit(calibrate(local))
    return curve, {"source": f"measured on model {local.model_id} ({local.device})", **curve.to_dict()}
