"""The discrete-event loop of the routing simulation (the model is in :mod:`kvcli.route.simulator`'s docstring).

Events live in one heap of plain tuples ``(time, kind, seq, request, payload)``: at one instant prefill ends run
first, then decode ends, then dispatches (each in the order they were scheduled, ``seq``). Arrivals are not in the
heap: they come from the trace already sorted by (time, request index), and one runs once every heap event at or
before its time has run, which is the same order as if arrivals were heap events of the last kind.

Per request the loop does a fixed number of steps (two or three heap events, two prefix matches and one store on
its node's LRU, one policy decision) on per-request lists prepared once; the per-request results are plain lists,
turned into numpy arrays once at the end (:class:`Records`).
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from kvcli.store.hashing import reusable_tokens
from kvcli.store.lru import ChunkLru

PREFILL_DONE, DECODE_DONE, DISPATCH = 0, 1, 2


@dataclass(slots=True)
class Records:
    """What happened to each request (lists ``[requests]``, simulated seconds) and two cluster-wide counts.

    Attributes:
        node: the node it was sent to. hit_tokens: tokens found in that node's cache at prefill start.
        dispatch, prefill_start, first_token, finish: times. injected, measured: lookup delays (0 without one).
        looked_up, timed_out: whether a cache manager was asked, and whether the router gave up waiting.
        evictions: chunks evicted from all node caches. peak_imbalance: max - min outstanding requests, at worst.
    """

    node: list[int]
    hit_tokens: list[int]
    dispatch: list[float]
    prefill_start: list[float]
    first_token: list[float]
    finish: list[float]
    injected: list[float]
    measured: list[float]
    looked_up: list[bool]
    timed_out: list[bool]
    evictions: int = 0
    peak_imbalance: int = 0

    @classmethod
    def empty(cls, count: int) -> Records:
        """Records of ``count`` requests, none routed yet (node -1, times and delays 0)."""
        times = {name: [0.0] * count for name in ("dispatch", "prefill_start", "first_token", "finish",
                                                  "injected", "measured")}
        return cls(node=[-1] * count, hit_tokens=[0] * count, looked_up=[False] * count,
                   timed_out=[False] * count, **times)


class EventLoop:
    """One simulation run: N nodes (LRU chunk caches, FIFO queues, batch slots), one policy, a list of requests.

    Args:
        requests: the :class:`~kvcli.route.simulator.SimRequest` list (passed to the policy as is).
        arrivals: ``[(time, request index)]`` sorted ascending. decode_seconds: per request, ``[requests]``.
        policy: a :class:`~kvcli.route.policies.Policy`. view: the policy's :class:`ClusterView`, kept current.
        capacity_chunks: per node cache (None: unlimited). prefill_seconds: ``(new, cached tokens) -> seconds``.
    """

    def __init__(self, requests, arrivals, decode_seconds, policy, view, capacity_chunks, max_batch: int,
                 prefill_seconds) -> None:
        nodes = len(view.load_tokens)
        self.requests, self.arrivals, self.decode_seconds = requests, arrivals, decode_seconds
        self.prompt = [r.prompt_tokens for r in requests]
        self.chunk_ids = [r.chunk_ids for r in requests]
        self.policy, self.view, self.chunk_size = policy, view, view.chunk_size
        self.max_batch, self.prefill_seconds = max_batch, prefill_seconds
        self.caches = [ChunkLru(capacity_chunks) for _ in range(nodes)]
        self.queues = [deque() for _ in range(nodes)]
        self.active, self.prefilling = [0] * nodes, [False] * nodes
        self.estimate = [0] * len(requests)
        self.out = Records.empty(len(requests))
        self.heap: list[tuple] = []
        self.seq = 0
        self.handlers = (self.prefill_done, self.decode_done, self.dispatch)  # indexed by event kind

    def push(self, t: float, kind: int, i: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, i, payload))

    def run(self) -> Records:
        """Run every request to its last token; returns the records (the loop is spent)."""
        for t, i in self.arrivals:
            self.run_until(t)
            self.arrive(t, i)
        self.run_until(math.inf)
        return self.out

    def run_until(self, t: float) -> None:
        """Run the heap's events at or before ``t``, in order (with those they schedule in that span)."""
        heap, pop, handlers = self.heap, heapq.heappop, self.handlers
        while heap and heap[0][0] <= t:
            when, kind, _, i, payload = pop(heap)
            handlers[kind](when, i, payload)

    def arrive(self, t: float, i: int) -> None:
        lookup = self.policy.lookup(self.requests[i])
        if lookup is None:
            self.dispatch(t, i, None)
            return
        out = self.out
        out.looked_up[i], out.timed_out[i] = True, lookup.timed_out
        out.injected[i], out.measured[i] = lookup.injected_s, lookup.measured_s
        self.push(t + lookup.wait_s, DISPATCH, i, lookup)

    def dispatch(self, t: float, i: int, lookup) -> None:
        view = self.view
        node = self.policy.choose(self.requests[i], view, lookup)
        assert 0 <= node < len(self.queues), f"policy chose node {node}"
        self.out.node[i], self.out.dispatch[i] = node, t
        estimate = self.prompt[i] - reusable_tokens(self.chunk_size * self.caches[node].match(self.chunk_ids[i]),
                                                    self.prompt[i])
        self.estimate[i] = estimate
        view.load_tokens[node] += estimate
        loads = view.load_requests
        loads[node] += 1
        if max(loads) - min(loads) > self.out.peak_imbalance:
            self.out.peak_imbalance = max(loads) - min(loads)
        self.queues[node].append(i)
        self.start_prefill(t, node)

    def start_prefill(self, t: float, node: int) -> None:
        """Start the next queued prefill on ``node`` if it is not prefilling and has a free batch slot."""
        queue = self.queues[node]
        if self.prefilling[node] or not queue or self.active[node] >= self.max_batch:
            return
        i = queue.popleft()
        self.active[node] += 1
        self.prefilling[node] = True
        hit = reusable_tokens(self.chunk_size * self.caches[node].match(self.chunk_ids[i]), self.prompt[i])
        new = self.prompt[i] - hit
        self.view.load_tokens[node] += new - self.estimate[i]
        self.estimate[i] = new
        self.out.hit_tokens[i], self.out.prefill_start[i] = hit, t
        self.push(t + self.prefill_seconds(new, hit), PREFILL_DONE, i, node)

    def prefill_done(self, t: float, i: int, node: int) -> None:
        new, evicted = self.caches[node].store(self.chunk_ids[i])
        if new or evicted:
            self.out.evictions += len(evicted)
            self.policy.on_cache_change(node, new, evicted)
        self.view.load_tokens[node] -= self.estimate[i]
        self.prefilling[node] = False
        self.out.first_token[i] = t
        self.push(t + self.decode_seconds[i], DECODE_DONE, i, node)
        self.start_prefill(t, node)

    def decode_done(self, t: float, i: int, node: int) -> None:
        self.active[node] -= 1
        loads = self.view.load_requests
        loads[node] -= 1
        if max(loads) - min(loads) > self.out.peak_imbalance:
            self.out.peak_imbalance = max(loads) - min(loads)
        self.out.finish[i] = t
        self.start_prefill(t, node)
