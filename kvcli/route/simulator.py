"""KV-cache-aware routing, simulated: N serving nodes with LRU chunk caches, in a discrete-event loop.

The model (what ``kvcli route`` simulates; docs/routing.md says the same for users):

* **Requests** are hashed once (:func:`prepare_requests`): one 16-byte prefix-chained hash per *full* chunk
  (:mod:`kvcli.hashing`), the cache salt in the root, so two tenants never share a chunk.
* **Arrivals**: at the trace's timestamps (seconds), or Poisson at ``rate`` requests/s (seeded) with ``--rate``.
* **Routing**: at arrival the policy picks a node. A policy that asks a cache manager (``cache-manager``) first
  waits for its answer (``Lookup.wait_s``: injected delay + measured Redis latency, capped at the timeout); the
  request reaches the node after that wait.
* **Node** (one per ``nodes``): an LRU cache of ``capacity`` tokens (``capacity // chunk_size`` chunks), a FIFO
  queue and at most ``max_batch`` admitted requests (a slot is held from prefill start to the last output token).
  Prefill is serialized per node (one at a time, FIFO: prefill is compute-bound, so two at once take as long as
  one after the other); decodes of admitted requests overlap freely (memory-bound, batched).
* **Prefill** covers only the tokens not cached on that node at prefill start (the longest run of the request's
  chunks from chunk 0): ``seconds = cost.predict(prompt - hit, hit)``. At prefill end the first token is out and
  the node stores all the request's full chunks. **Decode** then takes ``(output_tokens - 1) * decode_tpot`` s.
* **Load** a node reports: outstanding requests (routed, not finished) and outstanding prefill tokens (tokens of
  routed requests whose prefill has not ended, counted without the tokens cached on the node when routed, then
  corrected to the true count at prefill start).
* At one instant, prefill ends come first, then decode ends, then dispatches, then arrivals (each in order).

Simulated time only: nothing sleeps, so 10,000 requests take seconds. Per request the work is per chunk (LRU and
bitmask updates), never per token.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from kvcli.errors import BadInputError
from kvcli.route.cachemanager import DelaySpec
from kvcli.route.nodecache import ChunkIndex
from kvcli.store.hashing import chunk_prompt, namespace_root
from kvcli.store.lru import ChunkLru

# Independent random streams of one seed: np.random.default_rng([seed, stream]).
STREAM_ARRIVALS, STREAM_POLICY, STREAM_LOOKUP = 1, 2, 3
_PREFILL_DONE, _DECODE_DONE, _DISPATCH, _ARRIVAL = 0, 1, 2, 3


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
        capacity, chunk = self.capacity_tokens, self.chunk_size
        checks = [("--nodes", self.nodes, self.nodes >= 1, ">= 1"),
                  ("--chunk-size", chunk, chunk >= 1, ">= 1"),
                  ("--max-batch", self.max_batch, self.max_batch >= 1, ">= 1"),
                  ("--decode-tpot", self.decode_tpot, self.decode_tpot >= 0, ">= 0"),
                  ("--output-length", self.default_output_tokens, self.default_output_tokens >= 0, ">= 0"),
                  ("--rate", self.rate, self.rate is None or self.rate > 0, "> 0"),
                  ("--seed", self.seed, self.seed >= 0, ">= 0"),
                  ("--abs-threshold", self.abs_threshold, self.abs_threshold >= 0, ">= 0"),
                  ("--rel-threshold", self.rel_threshold, self.rel_threshold >= 1, ">= 1 (below 1 it acts as 1)"),
                  ("--cache-threshold", self.cache_threshold, 0 <= self.cache_threshold <= 1, "in [0, 1]"),
                  ("--w", self.cost_weight, self.cost_weight >= 0, ">= 0"),
                  ("--temperature", self.temperature, self.temperature >= 0, ">= 0"),
                  ("--lookup-timeout", self.lookup_timeout, self.lookup_timeout is None or self.lookup_timeout > 0,
                   "> 0 seconds"),
                  ("--node-capacity", capacity, capacity is None or capacity >= chunk,
                   f"at least one chunk (>= --chunk-size, {chunk} tokens)")]
        for option, value, ok, requirement in checks:
            if not ok:
                raise BadInputError(f"{option} must be {requirement}, got {value:g}")

    @property
    def capacity_chunks(self) -> int | None:
        """Chunks a node's cache holds (None = unlimited)."""
        return None if self.capacity_tokens is None else self.capacity_tokens // self.chunk_size


@dataclass(frozen=True, slots=True)
class SimRequest:
    """A request as the simulator sees it: hashes instead of tokens (a few bytes per chunk, not per token).

    Attributes:
        id: the trace's id. hashes: 16-byte chunk hashes, one per full chunk, chained from the salt's root.
        prompt_tokens: prompt length (tokens). output_length: tokens generated, or None (config default).
        timestamp: arrival in seconds, or None. cache_salt: tenant.
    """

    id: str
    hashes: tuple[bytes, ...]
    prompt_tokens: int
    output_length: int | None
    timestamp: float | None
    cache_salt: str = ""


def prepare_requests(trace: Iterable, chunk_size: int, tokenizer: str = "") -> list[SimRequest]:
    """Hash every request of ``trace`` (kvcli.traces.Request objects) once; the token arrays are not kept.

    The namespace root is ``namespace_root("kvcli-route", tokenizer, cache_salt)``: only the salt varies inside
    one run, and it is what keeps tenants apart.
    """
    roots: dict[str, bytes] = {}
    out = []
    for r in trace:
        root = roots.get(r.cache_salt) or roots.setdefault(r.cache_salt, namespace_root(
            "kvcli-route", tokenizer, r.cache_salt))
        hashes = tuple(chunk_prompt(r.token_ids, chunk_size, root).hashes)
        out.append(SimRequest(r.id, hashes, int(len(r.token_ids)), r.output_length, r.timestamp, r.cache_salt))
    return out


def arrival_times(requests: list[SimRequest], rate: float | None, seed: int) -> np.ndarray:
    """Arrival time of each request, seconds ``[requests]``: Poisson at ``rate`` (first at 0, exponential gaps
    from stream ``STREAM_ARRIVALS``), else the trace's timestamps.

    Raises:
        BadInputError: no ``rate`` and a request without a timestamp.
    """
    if rate is not None:
        gaps = np.random.default_rng([seed, STREAM_ARRIVALS]).exponential(1.0 / rate, len(requests))
        return np.concatenate([[0.0], np.cumsum(gaps[1:])]) if len(requests) else gaps
    missing = next((r for r in requests if r.timestamp is None), None)
    if missing is not None:
        raise BadInputError(f"request {missing.id} has no timestamp; pass --rate to use Poisson arrivals")
    return np.array([r.timestamp for r in requests], dtype=np.float64)


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
    ``count_measured_latency``; ``injected`` is the injected delay (both 0 without a lookup).
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


def simulate(requests: list[SimRequest], policy, config: SimConfig, cost) -> SimResult:
    """Run ``requests`` through ``policy`` on ``config.nodes`` nodes in simulated time.

    Args:
        requests: from :func:`prepare_requests` (hashed with ``config.chunk_size``).
        policy: a :class:`kvcli.policies.Policy` (fresh: policies keep state).
        cost: anything with ``predict(new_tokens, cached_tokens) -> seconds`` (a :class:`kvcli.costcurve.CostCurve`).

    Raises:
        BadInputError: as :func:`arrival_times`.
    """
    return _Engine(requests, policy, config, cost).run()


class _Engine:
    def __init__(self, requests, policy, config: SimConfig, cost) -> None:
        n, count = config.nodes, len(requests)
        self.requests, self.policy, self.config, self.cost = requests, policy, config, cost
        self.cache = ChunkIndex(n, config.capacity_chunks)
        self.view = ClusterView([0] * n, [0] * n, config.chunk_size)
        self.queues = [deque() for _ in range(n)]
        self.active, self.prefilling = [0] * n, [False] * n
        self.estimate = [0] * count
        self.rec = {k: np.zeros(count) for k in ("dispatch", "prefill_start", "first_token", "finish",
                                                 "injected", "measured")}
        self.node = np.full(count, -1, dtype=np.int64)
        self.hit = np.zeros(count, dtype=np.int64)
        self.looked_up, self.timed_out = np.zeros(count, bool), np.zeros(count, bool)
        self.arrival = arrival_times(requests, config.rate, config.seed)
        self.heap: list = [(t, _ARRIVAL, i, i, None) for i, t in enumerate(self.arrival.tolist())]
        heapq.heapify(self.heap)
        self.seq, self.evictions, self.peak = count, 0, 0

    def push(self, t: float, kind: int, i: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, i, payload))

    def run(self) -> SimResult:
        handlers = {_ARRIVAL: self.on_arrival, _DISPATCH: self.on_dispatch,
                    _PREFILL_DONE: self.on_prefill_done, _DECODE_DONE: self.on_decode_done}
        heap = self.heap
        while heap:
            t, kind, _, i, payload = heapq.heappop(heap)
            handlers[kind](t, i, payload)
        r = self.rec
        return SimResult(getattr(self.policy, "name", type(self.policy).__name__), self.config.nodes, self.node,
                         np.array([q.prompt_tokens for q in self.requests], dtype=np.int64), self.hit,
                         self.arrival, r["dispatch"], r["prefill_start"], r["first_token"], r["finish"],
                         r["injected"], r["measured"], self.looked_up, self.timed_out, self.evictions, self.peak)

    def on_arrival(self, t: float, i: int, _) -> None:
        lookup = self.policy.lookup(self.requests[i])
        if lookup is None:
            self.on_dispatch(t, i, None)
            return
        self.looked_up[i], self.timed_out[i] = True, lookup.timed_out
        self.rec["injected"][i], self.rec["measured"][i] = lookup.injected_s, lookup.measured_s
        self.push(t + lookup.wait_s, _DISPATCH, i, lookup)

    def on_dispatch(self, t: float, i: int, lookup: Lookup | None) -> None:
        req, view = self.requests[i], self.view
        node = self.policy.choose(req, view, lookup)
        assert 0 <= node < self.config.nodes, f"policy chose node {node}"
        self.node[i], self.rec["dispatch"][i] = node, t
        est = req.prompt_tokens - self.config.chunk_size * self.cache.depth(node, req.hashes)
        self.estimate[i] = est
        view.load_tokens[node] += est
        view.load_requests[node] += 1
        self.peak = max(self.peak, max(view.load_requests) - min(view.load_requests))
        self.queues[node].append(i)
        self.try_start(t, node)

    def try_start(self, t: float, node: int) -> None:
        if self.prefilling[node] or not self.queues[node] or self.active[node] >= self.config.max_batch:
            return
        i = self.queues[node].popleft()
        req = self.requests[i]
        self.active[node] += 1
        self.prefilling[node] = True
        hit = self.config.chunk_size * self.cache.depth(node, req.hashes)
        new = req.prompt_tokens - hit
        self.view.load_tokens[node] += new - self.estimate[i]
        self.estimate[i], self.hit[i], self.rec["prefill_start"][i] = new, hit, t
        self.push(t + float(self.cost.predict(new, hit)), _PREFILL_DONE, i, node)

    def on_prefill_done(self, t: float, i: int, node: int) -> None:
        req = self.requests[i]
        new, evicted = self.cache.store(node, req.hashes)
        self.evictions += len(evicted)
        if new or evicted:
            self.policy.on_cache_change(node, new, evicted)
        self.view.load_tokens[node] -= self.estimate[i]
        self.prefilling[node] = False
        self.rec["first_token"][i] = t
        out = req.output_length if req.output_length is not None else self.config.default_output_tokens
        self.push(t + max(out - 1, 0) * self.config.decode_tpot, _DECODE_DONE, i, node)
        self.try_start(t, node)

    def on_decode_done(self, t: float, i: int, node: int) -> None:
        self.active[node] -= 1
        loads = self.view.load_requests
        loads[node] -= 1
        self.peak = max(self.peak, max(loads) - min(loads))
        self.rec["finish"][i] = t
        self.try_start(t, node)


def single_node_hit_tokens(requests: list[SimRequest], config: SimConfig) -> int:
    """Hit tokens of one node holding the whole cluster's capacity (``nodes x capacity``), serving every request
    in arrival order with no overlap: the ceiling no routing policy can beat with the same total cache."""
    capacity = None if config.capacity_chunks is None else config.capacity_chunks * config.nodes
    cache = ChunkLru(capacity)
    order = np.argsort(arrival_times(requests, config.rate, config.seed), kind="stable")
    hit = 0
    for i in order.tolist():
        hashes = requests[i].hashes
        hit += cache.match(hashes)
        cache.store(hashes)
    return hit * config.chunk_size


def kv_bytes_per_token(preset: str) -> int:
    """KV bytes per token of a model preset in its default dtype (:mod:`kvcli.model`; imports torch).
    Raises BadInputError for an unknown preset."""
    from kvcli.model.presets import get_preset

    config = get_preset(preset)
    return config.kv_bytes_per_token(config.dtype)


def load_requests(path, fmt: str = "auto", tokenizer: str = "cl100k_base", chunk_size: int = 256,
                  limit: int | None = None, track=None) -> list[SimRequest]:
    """Read (:func:`kvcli.traces.read_trace`), cut to the first ``limit`` requests, and hash a trace.
    ``track(iterable) -> iterable`` may wrap the stream for progress. Raises BadInputError (also on no requests, or
    ``limit`` < 1)."""
    import itertools

    from kvcli.traces.detect import read_trace

    if limit is not None and limit < 1:
        raise BadInputError(f"--limit must be >= 1, got {limit}")
    stream = itertools.islice(read_trace(path, fmt, tokenizer), limit)
    requests = prepare_requests(track(stream) if track else stream, chunk_size, tokenizer)
    if not requests:
        raise BadInputError("the trace has no requests", path=str(path))
    return requests


def check_prefill_tps(prefill_tps: float | None) -> None:
    """BadInputError unless ``prefill_tps`` is None or a finite number > 0."""
    if prefill_tps is not None and not (math.isfinite(prefill_tps) and prefill_tps > 0):
        raise BadInputError(f"--prefill-tps must be a finite number > 0, got {prefill_tps}")


def prefill_cost(prefill_tps: float | None, preset: str = "cpu"):
    """The prefill cost curve: a flat ``prefill_tps`` tokens/s when given, else measured now on the local model
    (:func:`kvcli.costcurve.calibrate` on ``build_model(preset)``, a few seconds on CPU).

    Returns:
        (CostCurve, JSON-ready description). Raises BadInputError, ModelFailure.
    """
    from kvcli.model.costcurve import CostCurve, calibrate

    if prefill_tps is not None:
        check_prefill_tps(prefill_tps)
        curve = CostCurve.from_tokens_per_second(prefill_tps)
        return curve, {"source": f"--prefill-tps {prefill_tps:g}", **curve.to_dict()}
    from kvcli.model.llama import build_model

    model = build_model(preset)
    curve = CostCurve.fit(calibrate(model))
    return curve, {"source": f"measured on model preset {preset!r} ({model.device})", **curve.to_dict()}
