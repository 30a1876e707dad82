"""The discrete-event loop of the routing simulation (the model is in :mod:`kvcli.route.simulator`'s docstring).

Events live in one heap of plain tuples ``(time, kind, seq, request, payload)``: at one instant prefill ends run
first, then decode ends, then dispatches (each in the order they were scheduled, ``seq``). Arrivals are not in the
heap: they come from the trace already sorted by (time, request index), and one runs once every heap event at or
before its time has run, which is the same order as if arrivals were heap events of the last kind.

Per request the loop does a fixed number of steps (two or three heap events, one or two prefix matches and one
store on its node's LRU, one policy decision) on per-request lists prepared once; the per-request results are plain
lists, turned into numpy arrays once at the end (:class:`Records`). The loop is one method with its state in local
variables (issue 11); the store is :meth:`ChunkLru.touch` (no list of new chunks) unless the policy watches the
caches; the prefix match at dispatch is reused when the prefill starts at once (the node's cache changes only when
one of its prefills ends).
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

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

    A policy whose ``looks_up`` is False is never asked :meth:`~kvcli.route.policies.Policy.lookup` (it answers
    None), and one whose ``watches_cache`` is False is never told of cache changes (it ignores them); a policy
    without these attributes is asked and told.
    """

    def __init__(self, requests, arrivals, decode_seconds, policy, view, capacity_chunks, max_batch: int,
                 prefill_seconds) -> None:
        self.requests, self.arrivals, self.decode_seconds = requests, arrivals, decode_seconds
        self.policy, self.view = policy, view
        self.capacity_chunks, self.max_batch, self.prefill_seconds = capacity_chunks, max_batch, prefill_seconds

    def run(self) -> Records:
        """Run every request to its last token; returns the records.

        One loop over the arrivals, with the heap's events at or before each arrival handled first (the last
        arrival, at infinity, drains the heap). Per request: at most one lookup, one policy decision, two prefix
        matches on its node's cache (the one at dispatch is reused when the prefill starts at once, as nothing can
        change the cache in between), one store; everything in local variables.
        """
        requests, decode_seconds, policy, view = self.requests, self.decode_seconds, self.policy, self.view
        count, nodes, max_batch, prefill_seconds = len(requests), len(view.load_tokens), self.max_batch, \
            self.prefill_seconds
        chunk_size = view.chunk_size
        prompt = [r.prompt_tokens for r in requests]
        chunk_ids = [r.chunk_ids for r in requests]
        # Most tokens a request can reuse (all but the last): reusable_tokens(hit, prompt) == min(hit, limit).
        limit = reusable_tokens(np.array(prompt, dtype=np.int64), np.array(prompt, dtype=np.int64)).tolist()
        caches = [ChunkLru(self.capacity_chunks) for _ in range(nodes)]
        matches = [c.match for c in caches]
        queues = [deque() for _ in range(nodes)]
        active, prefilling, estimate = [0] * nodes, [False] * nodes, [0] * count
        load_tokens, load_requests = view.load_tokens, view.load_requests
        out = Records.empty(count)
        node_of, hit_tokens, dispatched, prefill_start, first_token, finish = (
            out.node, out.hit_tokens, out.dispatch, out.prefill_start, out.first_token, out.finish)
        choose = policy.choose
        lookup = policy.lookup if getattr(policy, "looks_up", True) else None
        notify = policy.on_cache_change if getattr(policy, "watches_cache", True) else None
        # Only a watching policy needs the new chunks named (ChunkLru.touch is store without them).
        stores = [c.store if notify is not None else c.touch for c in caches]
        heap: list[tuple] = []
        push, pop, seq = heapq.heappush, heapq.heappop, itertools.count()
        evictions, peak = 0, 0

        def start_prefill(t: float, node: int, i: int, hit: int) -> None:
            """Start request ``i``'s prefill on ``node`` (free, not prefilling), ``hit`` tokens cached."""
            active[node] += 1
            prefilling[node] = True
            new = prompt[i] - hit
            load_tokens[node] += new - estimate[i]
            estimate[i] = new
            hit_tokens[i], prefill_start[i] = hit, t
            push(heap, (t + prefill_seconds(new, hit), PREFILL_DONE, next(seq), i, node))

        def start_next(t: float, node: int) -> None:
            """Start the next queued prefill on ``node`` (its queue is not empty) if it is not prefilling and has a
            free batch slot."""
            if not prefilling[node] and active[node] < max_batch:
                i = queues[node].popleft()
                hit = chunk_size * matches[node](chunk_ids[i])
                start_prefill(t, node, i, hit if hit < limit[i] else limit[i])

        def dispatch(t: float, i: int, answer) -> None:
            nonlocal peak
            node = choose(requests[i], view, answer)
            assert 0 <= node < nodes, f"policy chose node {node}"
            node_of[i], dispatched[i] = node, t
            hit = chunk_size * matches[node](chunk_ids[i])
            if hit > limit[i]:
                hit = limit[i]
            estimate[i] = prompt[i] - hit
            load_tokens[node] += estimate[i]
            load_requests[node] += 1
            high = load_requests[node]  # only this node's count rose: the imbalance can only grow through it
            if high - min(load_requests) > peak:
                peak = high - min(load_requests)
            if not prefilling[node] and active[node] < max_batch:  # then its queue is empty: start at once
                start_prefill(t, node, i, hit)
            else:
                queues[node].append(i)

        for t, i in itertools.chain(self.arrivals, [(math.inf, -1)]):
            while heap and heap[0][0] <= t:
                when, kind, _, j, payload = pop(heap)
                if kind == PREFILL_DONE:
                    node = payload
                    if notify is None:
                        evictions += len(stores[node](chunk_ids[j]))
                    else:
                        new, evicted = stores[node](chunk_ids[j])
                        evictions += len(evicted)
                        if new or evicted:
                            notify(node, new, evicted)
                    load_tokens[node] -= estimate[j]
                    prefilling[node] = False
                    first_token[j] = when
                    push(heap, (when + decode_seconds[j], DECODE_DONE, next(seq), j, node))
                    if queues[node]:
                        start_next(when, node)
                elif kind == DECODE_DONE:
                    node = payload
                    active[node] -= 1
                    load_requests[node] -= 1
                    low = load_requests[node]  # only this node's count fell
                    if max(load_requests) - low > peak:
                        peak = max(load_requests) - low
                    finish[j] = when
                    if queues[node]:
                        start_next(when, node)
                else:
                    dispatch(when, j, payload)
            if i < 0:
                break
            answer = None if lookup is None else lookup(requests[i])
            if answer is None:
                dispatch(t, i, None)
            else:
                out.looked_up[i], out.timed_out[i] = True, answer.timed_out
                out.injected[i], out.measured[i] = answer.injected_s, answer.measured_s
                push(heap, (t + answer.wait_s, DISPATCH, next(seq), i, answer))
        out.evictions, out.peak_imbalance = evictions, peak
        return out
