"""Measuring in a replay: which requests run the model, timed prefills (fastest of repeats), chunk transfer
rates calibrated on the replay's own server, and how well the cost curve predicts what was measured.
"""
from __future__ import annotations

import os
import time

import numpy as np
import redis

from kvcli.model.costcurve import CostCurve
from kvcli.store import cluster
from kvcli.store.chunkstore import ChunkStore


def pick_measured(lengths: np.ndarray, count: int | None, max_tokens: int, seed: int) -> set[int]:
    """Indices of the requests that run the model: ``count`` of those with 1..max_tokens tokens, evenly spread.

    ``count`` None picks every non-empty request. Deterministic for a seed (a seeded jitter inside each stride).
    """
    if count is None:
        return set(np.flatnonzero(lengths > 0).tolist())
    eligible = np.flatnonzero((lengths > 0) & (lengths <= max_tokens))
    if count <= 0 or eligible.size == 0:
        return set()
    if count >= eligible.size:
        return set(eligible.tolist())
    edges = np.linspace(0, eligible.size, count + 1)
    rng = np.random.default_rng(seed)
    picks = [int(eligible[int(lo + rng.random() * (hi - lo))]) for lo, hi in zip(edges[:-1], edges[1:])]
    return set(picks)


def curve_check(curve: CostCurve, samples) -> dict:
    """How well the cost curve predicts measured prefills: median and max of measured / predicted seconds."""
    ratios = sorted(s.seconds / p for s in samples
                    if (p := float(curve.predict(s.new_tokens, s.cached_tokens))) > 0)
    if not ratios:
        return {"samples": 0}
    return {"samples": len(ratios), "median_measured_over_predicted": ratios[len(ratios) // 2],
            "max_measured_over_predicted": ratios[-1]}


def timed_prefill(model, tokens, past, repeats: int = 2):
    """``(seconds, (logits, kv))``: the fastest of ``repeats`` identical prefills (this VM stalls for
    hundreds of ms at random; the least-disturbed run is the measurement, as for the cost curve)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = model.prefill(tokens, past)
        model.synchronize()  # a GPU runs asynchronously: time the work, not its launch
        best = min(best, time.perf_counter() - t0)
    return best, out


def calibrate_transfer(client: redis.Redis, store: ChunkStore, chunks: int = 4, cap: int = 1 << 20) -> tuple[float, float]:
    """Seconds per chunk to (SET, GET) one chunk-sized value on this server, measured now (min of 3).

    Values over ``cap`` bytes are timed at ``cap`` and scaled by size (loopback transfers are bandwidth
    bound at that size; MEASURED.md).
    """
    size = store.config.payload_bytes + store.config.header_bytes
    probe = min(size, cap)
    value = os.urandom(64) * (probe // 64) + os.urandom(probe % 64)
    # named like payload keys of the run's namespace, so an interrupted run's cleanup (purge) removes them too
    keys = [store.payload_key(b"\xff" * 15 + bytes([i])) for i in range(chunks)]
    best_set = best_get = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.set(key, value)
        with cluster.uninterrupted():
            pipe.execute()
        t1 = time.perf_counter()
        cluster.mget(client, keys)
        t2 = time.perf_counter()
        best_set, best_get = min(best_set, t1 - t0), min(best_get, t2 - t1)
    cluster.unlink(client, keys)
    scale = size / probe / chunks
    return best_set * scale, best_get * scale
