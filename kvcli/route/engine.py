"""The discrete-event loop of the routing simulation (the model is in :mod:`kvcli.route.simulator`'s docstring).

Events live in one heap of 3-tuples ``(time, key, request)``, ``key = kind * 2**52 + seq``: at one instant prefill
ends run first, then decode ends, then dispatches (each in the order they were scheduled, ``seq``). The node of a
prefill or decode end is the request's (:attr:`Records.node`); a lookup's answer waits in a dict until its
dispatch. Arrivals are not in the heap: they come from the trace already sorted by (time, request index), and one
runs once every heap event at or before its time has run, which is the same order as if arrivals were heap events
of the last kind.

Per request the loop does a fixed number of steps (two or three heap events, one or two prefix matches and one
store on its node's LRU, one policy decision) on per-request lists prepared once; the per-request results are plain
lists, turned into numpy arrays once at the end (:class:`Records`). The loop is one method with its state in local
variables and no inner functions (attribute and closure lookups cost more than the work per event); the store is
:meth:`ChunkLru.touch` (no list of new chunks) unless the policy watches the caches; the prefix match at dispatch is
reused when the prefill starts at once (the node's cache changes only when one of its prefills ends). With a policy
that mirrors the nodes' caches
(:meth:`~kvcli.route.policies.Policy.mirror_nodes`: ``prefix``, ``cache-aware``, ``cost``), a node's cache is an
unlimited :class:`ChunkLru` that, at each store, drops the chunks the policy's LRU for that node evicted when it
stored the same request: the same chunks held at every moment, one LRU's work instead of two. The policy also
records the request's depth in its index when it routes it, which is the request's hit when its prefill starts (the
node has then stored every request sent to it before): no prefix match on the node's cache then, nor at dispatch
when the node has nothing else in flight before its prefill end.

With tiers behind the node's cache (``lower``), the node's cache is the first tier: its lookup and store are the
ones above (its touches start at chunk 0, as without tiers). At each prefix match the lookup goes on from where
that cache stopped through the node's lower tiers (:func:`kvcli.sim.tiers.lookup_tiers`; a shared tier is one
cache in every node's list), and the prefill covers what follows the whole hit run; at the prefill's end the
lower tiers get the promotions and the new chunks (:func:`~kvcli.sim.tiers.write_tiers`) from the bounds found at
its start (the node's own tiers cannot change in between: its prefills run one at a time; a shared tier can).
"""
from __future__ import annotations

import gc
import heapq
import itertools
import math
import operator
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from kvcli.sim.lru import ChunkLru
from kvcli.sim.tiers import lookup_tiers, served_tokens, write_tiers
from kvcli.store.hashing import reusable_tokens

PREFILL_DONE, DECODE_DONE, DISPATCH = 0, 1, 2
# Heap keys: kind * 2**52 + sequence number, one int that orders as (kind, seq) for < 2**52 events.
_PREFILL_DONE, _DECODE_DONE, _DISPATCH = (kind << 52 for kind in (PREFILL_DONE, DECODE_DONE, DISPATCH))


@dataclass(slots=True)
class Records:
    """What happened to each request (lists ``[requests]``, simulated seconds) and two cluster-wide counts.

    Attributes:
        node: the node it was sent to. hit_tokens: tokens found in that node's cache at prefill start.
        dispatch, prefill_start, first_token, finish: times. injected, measured: lookup delays (0 without one).
        looked_up, timed_out: whether a cache manager was asked, and whether the router gave up waiting.
        evictions: chunks evicted from all node caches (the first tier's, with tiers). peak_imbalance: max - min
        outstanding requests, at worst. hit_tokens_by_tier: hit tokens each tier served, ``[tiers]`` (``[]``
        without tiers).
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
    hit_tokens_by_tier: list[int] = field(default_factory=list)

    @classmethod
    def empty(cls, count: int) -> Records:
        """Records of ``count`` requests, none routed yet (node -1, times and delays 0)."""
        return cls(node=[-1] * count, hit_tokens=[0] * count, dispatch=[0.0] * count, prefill_start=[0.0] * count,
                   first_token=[0.0] * count, finish=[0.0] * count, injected=[0.0] * count, measured=[0.0] * count,
                   looked_up=[False] * count, timed_out=[False] * count)


class EventLoop:
    """One simulation run: N nodes (LRU chunk caches, FIFO queues, batch slots), one policy, a list of requests.

    Args:
        requests: the :class:`~kvcli.route.simulator.SimRequest` list (passed to the policy as is).
        arrivals: ``[(time, request index)]`` sorted ascending. decode_seconds: per request, ``[requests]``.
        policy: a :class:`~kvcli.route.policies.Policy`. view: the policy's :class:`ClusterView`, kept current.
        capacity_chunks: per node cache (None: unlimited). prefill_seconds: ``(new, cached tokens) -> seconds``.
        lower: per node, the caches of the tiers behind its own, ``[nodes][tiers]`` in lookup order (a shared tier
            the same object in every list; empty lists: one tier, counted per tier;
            :meth:`~kvcli.route.simulator.SimConfig.lower_caches`), or None (no tiers).

    A policy whose ``looks_up`` is False is never asked :meth:`~kvcli.route.policies.Policy.lookup` (it answers
    None), and one whose ``watches_cache`` is False is never told of cache changes (it ignores them); a policy
    without these attributes is asked and told.
    """

    def __init__(self, requests, arrivals, decode_seconds, policy, view, capacity_chunks, max_batch: int,
                 prefill_seconds, lower: list[list[ChunkLru]] | None = None) -> None:
        self.requests, self.arrivals, self.decode_seconds, self.lower = requests, arrivals, decode_seconds, lower
        self.policy, self.view = policy, view
        self.capacity_chunks, self.max_batch, self.prefill_seconds = capacity_chunks, max_batch, prefill_seconds

    def run(self) -> Records:
        """Run every request to its last token; returns the records (:meth:`_loop`).

        Python's cyclic garbage collector is off meanwhile (its state is restored after): the loop allocates small
        containers at every event (heap entries, eviction lists) and makes no reference cycles, so the collections
        they trigger would only traverse the caches and the records (about 2 % of the instructions of a ``prefix``
        run on the Mooncake sample).
        """
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._loop()
        finally:
            if enabled:
                gc.enable()

    def _loop(self) -> Records:
        """The event loop of :meth:`run`.

        One loop: the next event is the heap's first if it is at or before the next arrival, else the arrival (the
        last, at infinity, drains the heap). Per request: at most one lookup, one policy decision, two prefix
        matches on its node's cache (the one at dispatch is reused when the prefill starts at once, as nothing can
        change the cache in between; with a mirroring policy, the one at prefill start is the depth the policy
        recorded, and so is the one at dispatch when the node has stored every earlier request sent to it), one
        store; everything in local variables, no call but the policy's, the caches' and the heap's (the one
        dispatch block serves an arrival without a lookup and a lookup's end).
        """
        requests, decode_seconds, policy, view = self.requests, self.decode_seconds, self.policy, self.view
        count, nodes, max_batch, prefill_seconds = len(requests), len(view.load_tokens), self.max_batch, \
            self.prefill_seconds
        chunk_size = view.chunk_size
        prompt = list(map(operator.attrgetter("prompt_tokens"), requests))
        chunk_ids = list(map(operator.attrgetter("chunk_ids"), requests))
        # Most tokens a request can reuse (all but the last): reusable_tokens(hit, prompt) == min(hit, limit).
        prompt_array = np.array(prompt, dtype=np.int64)
        limit = reusable_tokens(prompt_array, prompt_array).tolist()
        queues: list[deque[int]] = [deque() for _ in range(nodes)]  # per node, request indices waiting
        active, prefilling, estimate = [0] * nodes, [False] * nodes, [0] * count
        load_tokens, load_requests = view.load_tokens, view.load_requests
        out = Records.empty(count)
        node_of, hit_tokens, dispatched, prefill_start, first_token, finish = (
            out.node, out.hit_tokens, out.dispatch, out.prefill_start, out.first_token, out.finish)
        choose = policy.choose
        lookup = policy.lookup if getattr(policy, "looks_up", True) else None
        notify = policy.on_cache_change if getattr(policy, "watches_cache", True) else None
        # A policy whose index mirrors the nodes' caches hands over its evictions: then each node's cache is an
        # unlimited ChunkLru that drops what the index evicted at the same store (Policy.mirror_nodes).
        mirror = getattr(policy, "mirror_nodes", None)
        mirror = mirror(self.capacity_chunks) if mirror is not None and notify is None else None
        caches = [ChunkLru(self.capacity_chunks if mirror is None else None) for _ in range(nodes)]
        matches = [c.match for c in caches]
        forgets = [c.forget for c in caches]
        # Only a watching policy needs the new chunks named (ChunkLru.touch is store without them).
        stores = [c.store if notify is not None else c.touch for c in caches]
        lower = self.lower
        bounds_of: list = [None] * count  # request -> its last lookup's bounds in its node's lower tiers
        by_tier = [0] * (1 + len(lower[0])) if lower is not None else []
        answers: dict[int, object] = {}  # request -> its lookup's answer, until its DISPATCH event
        heap: list[tuple] = []  # (time, key, request): key = kind's base + sequence number (module docstring)
        push, pop = heapq.heappush, heapq.heappop
        seq, evictions, peak = 0, 0, 0
        arrivals = itertools.chain(self.arrivals, [(math.inf, -1)])
        next_t, next_i = next(arrivals)
        while True:
            if heap and heap[0][0] <= next_t:
                t, key, i = pop(heap)
                if key < _DISPATCH:
                    node = node_of[i]
                    if key < _DECODE_DONE:
                        if mirror is not None:
                            stores[node](chunk_ids[i])
                            evicted = mirror[node].popleft()[1]
                            if evicted:
                                evictions += len(evicted)
                                forgets[node](evicted)
                        elif notify is None:
                            evictions += len(stores[node](chunk_ids[i]))
                        else:
                            new, evicted = stores[node](chunk_ids[i])
                            evictions += len(evicted)
                            if new or evicted:
                                notify(node, new, evicted)
                        if lower is not None:
                            write_tiers(lower[node], chunk_ids[i], bounds_of[i], len(chunk_ids[i]))
                        load_tokens[node] -= estimate[i]
                        prefilling[node] = False
                        first_token[i] = t
                        seq += 1
                        push(heap, (t + decode_seconds[i], _DECODE_DONE + seq, i))
                    else:
                        active[node] -= 1
                        load_requests[node] -= 1
                        low = load_requests[node]  # only this node's count fell
                        if max(load_requests) - low > peak:
                            peak = max(load_requests) - low
                        finish[i] = t
                    # The node may start its next queued prefill.
                    queue = queues[node]
                    if not queue or prefilling[node] or active[node] >= max_batch:
                        continue
                    i = queue.popleft()
                    # Mirrored: i is the oldest decision not yet stored on node, its recorded depth is its hit.
                    hit = matches[node](chunk_ids[i]) if mirror is None else mirror[node][0][0]
                    if lower is not None:
                        bounds_of[i] = bounds = lookup_tiers(lower[node], chunk_ids[i], hit)
                        hit = bounds[-1]
                    hit *= chunk_size
                    if hit > limit[i]:
                        hit = limit[i]
                    estimate_i = estimate[i]
                else:  # a lookup's end: dispatch below
                    answer = answers.pop(i)
                    node = -1
            else:
                if next_i < 0:
                    break
                t, i = next_t, next_i
                next_t, next_i = next(arrivals)
                answer = None if lookup is None else lookup(requests[i])
                if answer is not None:
                    out.looked_up[i], out.timed_out[i] = True, answer.timed_out
                    out.injected[i], out.measured[i] = answer.injected_s, answer.measured_s
                    answers[i] = answer
                    seq += 1
                    push(heap, (t + answer.wait_s, _DISPATCH + seq, i))
                    continue
                node = -1
            if node < 0:  # dispatch request i at t
                node = choose(requests[i], view, answer)
                assert 0 <= node < nodes, f"policy chose node {node}"
                node_of[i], dispatched[i] = node, t
                if mirror is not None and len(mirror[node]) == 1:  # the node has stored every earlier decision
                    hit = mirror[node][0][0]
                else:
                    hit = matches[node](chunk_ids[i])
                if lower is not None:
                    bounds_of[i] = bounds = lookup_tiers(lower[node], chunk_ids[i], hit)
                    hit = bounds[-1]
                hit *= chunk_size
                if hit > limit[i]:
                    hit = limit[i]
                estimate[i] = estimate_i = prompt[i] - hit
                load_tokens[node] += estimate_i
                load_requests[node] += 1
                high = load_requests[node]  # only this node's count rose: the imbalance can only grow through it
                if high - min(load_requests) > peak:
                    peak = high - min(load_requests)
                if prefilling[node] or active[node] >= max_batch:  # else its queue is empty: start at once
                    queues[node].append(i)
                    continue
            # Start request i's prefill on node (free, not prefilling), hit tokens cached.
            active[node] += 1
            prefilling[node] = True
            new_tokens = prompt[i] - hit
            load_tokens[node] += new_tokens - estimate_i
            estimate[i] = new_tokens
            hit_tokens[i], prefill_start[i] = hit, t
            if lower is not None:
                for tier, tokens in enumerate(served_tokens([0] + bounds_of[i], chunk_size, hit)):
                    by_tier[tier] += tokens
            seq += 1
            push(heap, (t + prefill_seconds(new_tokens, hit), _PREFILL_DONE + seq, i))
        out.evictions, out.peak_imbalance, out.hit_tokens_by_tier = evictions, peak, by_tier
        return out
