"""Measuring in a replay: which requests run the model and on how many of their tokens, timed prefills (fastest
of repeats), chunk transfer rates calibrated on the replay's own server, and how well the cost curve predicts what
was measured.
"""
from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, cast

import numpy as np
import redis
import xxhash
from redis.cluster import RedisCluster

from kvcli.model.costcurve import PrefillCost, prefill_clock
from kvcli.prefixkv import concat_kv
from kvcli.replay.network import ServerRates
from kvcli.store import cluster
from kvcli.store.kvstore import KVStore
from kvcli.store.serde import decode_kv, encode_kv
from kvcli.store.written import PAYLOAD
from kvcli.units import dtype_bytes, torch_dtype

if TYPE_CHECKING:
    import torch


def pick_measured(lengths: np.ndarray, count: int | None, seed: int) -> set[int]:
    """Indices of the requests that run the model: ``count`` non-empty requests spread evenly over the trace (one
    at a seeded position inside each of ``count`` equal strides of them; deterministic for a seed). ``count`` None
    picks every non-empty request. Long prompts are picked too: :func:`measure_length` says how many of their
    tokens run."""
    eligible = np.flatnonzero(lengths > 0)
    if count is None:
        return set(eligible.tolist())
    if count <= 0 or eligible.size == 0:
        return set()
    if count >= eligible.size:
        return set(eligible.tolist())
    edges = np.arange(count + 1) * eligible.size // count  # integer strides, each at least one request long
    rng = np.random.default_rng(seed)
    return {int(eligible[lo + int(rng.integers(hi - lo))]) for lo, hi in zip(edges[:-1], edges[1:])}


#: Lengths a measured prompt is truncated to (tokens), longest first: the longest whose predicted cost fits.
MEASURE_LENGTHS = (8192, 4096, 2048, 1024, 512, 256, 128)


def measure_length(curve: PrefillCost, longest: int, requests: int, chunk_sizes: int, budget_seconds: float,
                   max_tokens: int) -> int:
    """How many tokens of each measured prompt run the model (tokens; prompts are truncated to it).

    The longest of ``min(max_tokens, longest)`` (the longest prompt picked, so a trace of short prompts runs them
    whole) and the :data:`MEASURE_LENGTHS` below it whose predicted measuring time fits ``budget_seconds`` for
    ``requests`` requests: per request, the full prefill twice and, per chunk size, the suffix prefill twice, taken
    as the last quarter of the prompt after three quarters cached (a typical hit). At least the shortest length, so
    every trace gets measured requests.
    """
    cap = max(1, min(max_tokens, longest))
    for length in (cap,) + tuple(x for x in MEASURE_LENGTHS if x < cap):
        quarter = max(1, length // 4)
        cost = requests * 2 * (float(curve.predict(length, 0))
                               + chunk_sizes * float(curve.predict(quarter, length - quarter)))
        if cost <= budget_seconds:
            return length
    return min(cap, MEASURE_LENGTHS[-1])


def curve_check(curve: PrefillCost, samples) -> dict:
    """How well the cost curve predicts measured prefills: median and max of measured / predicted seconds."""
    ratios = sorted(s.seconds / p for s in samples
                    if (p := float(curve.predict(s.new_tokens, s.cached_tokens))) > 0)
    if not ratios:
        return {"samples": 0}
    return {"samples": len(ratios), "median_measured_over_predicted": ratios[len(ratios) // 2],
            "max_measured_over_predicted": ratios[-1]}


def timed_prefill(model, tokens, past, repeats: int = 2):
    """``(seconds, (logits, kv))``: the fastest of ``repeats`` identical prefills, timed with
    :func:`~kvcli.model.costcurve.prefill_clock` (this VM stalls for hundreds of ms at random; the least-disturbed
    run is the measurement, as for the cost curve).

    A hybrid model's prefill (linear-attention layers, :mod:`kvcli.model.hf`) runs one forward per segment between
    consecutive chunk boundaries of the replay's chunk sizes, to read its linear layers' state at each boundary for
    the chunks it stores; the full prefill and the suffix prefill are both timed that way (what a prefix-caching
    engine that saves states at block boundaries runs), not as the single forward of an engine without a cache,
    which skips the per-segment overhead.

    The timed call returns the new tokens' KV only (``kv_for="new"``): the prefix is read where it lies, as an
    engine's attention reads its cache, and the returned ``kv`` (``past`` then the new tokens', on the model's
    device) is put together after the timing."""
    best, out = float("inf"), None
    clock = prefill_clock(model)
    for _ in range(repeats):
        model.synchronize()  # a GPU runs asynchronously: nothing queued earlier may land in this timing
        t0 = clock()
        out = model.prefill(tokens, past, kv_for="new")  # past_kv on the CPU: its copy to the device is timed too
        model.synchronize()  # ...and the work itself is timed, not its launch
        best = min(best, clock() - t0)
    assert out is not None, "repeats >= 1"
    logits, kv = out
    if past is not None:
        kv = concat_kv([past.to(kv.device), kv])
    return best, (logits, kv)


class SuffixTimings:
    """The timed suffix prefills of one measured request, shared by its lanes (chunk sizes): two lanes that reuse
    the same prefix KV, bit for bit, run the same computation (the same new tokens after the same past), so the
    second takes the first's timing and output instead of timing it again. Lanes often do: a prompt hit whole at
    16, 64 and 256 tokens reuses all but its last token at each. A different KV (a hybrid model's states, another
    quantization, a corrupted retrieve) is timed on its own."""

    def __init__(self, model, head) -> None:
        self._model, self._head = model, head
        self._done: dict[int, tuple] = {}  # reused tokens -> (past, seconds, (logits, kv))

    def timed(self, past) -> tuple[float, tuple, bool]:
        """``(seconds, (logits, kv), fresh)`` of the suffix prefill of ``head[reuse:]`` after ``past`` (``[layers,
        2, kv_heads, reuse, head_dim]``): :func:`timed_prefill`'s, or a lane's before this one with the same past
        (``fresh`` False: the same sample, not a new one)."""
        import torch

        reuse = past.shape[3]
        seen = self._done.get(reuse)
        if seen is not None and isinstance(past, torch.Tensor) and isinstance(seen[0], torch.Tensor) \
                and past.dtype == seen[0].dtype and torch.equal(past, seen[0]):
            return seen[1], seen[2], False
        seconds, out = timed_prefill(self._model, self._head[reuse:], past)
        self._done[reuse] = (past, seconds, out)
        return seconds, out, True


PROBE_CAP = 8 << 20  # the largest probe value (bytes); bigger chunks are timed at this size and scaled
PROBE_BATCH_BYTES = 32 << 20  # the most one probe batch holds (bytes)


def probe_plan(value_bytes: int, room: int | None = None) -> tuple[int, int]:
    """``(chunks, bytes)`` of the transfer calibration's larger batch: values of one chunk's size (at most
    :data:`PROBE_CAP`), up to 16 of them and :data:`PROBE_BATCH_BYTES` in all; with ``room`` (bytes left under
    maxmemory), at most 1/16 of it, so calibrating never pushes a small server over."""
    size = min(value_bytes, PROBE_CAP)
    if room is not None:
        size = max(4096, min(size, room // 256))
    chunks = max(2, min(16, PROBE_BATCH_BYTES // size))
    if room is not None:
        chunks = max(2, min(chunks, room // (16 * size)))
    return chunks, size


def calibrate_transfer(client: redis.Redis | RedisCluster, store: KVStore, room: int | None = None,
                       wire: bool = True) -> ServerRates:
    """Chunk SET and GET costs on this server, as one round trip plus a cost per chunk, and serialize and
    deserialize costs per chunk here, measured now (:class:`~kvcli.replay.network.ServerRates`); without ``wire``
    (a network model prices the transfers) serialize and deserialize only: nothing is written to the server, the
    SET and GET costs are 0 and ``spread`` is the (de)serializations' own.

    A batch of 1 value and a batch of ``k`` (:func:`probe_plan`) are each written in one pipeline and read in one
    MGET, 3 times after one warm-up round; from the fastest of each, the per-chunk cost is
    ``(t_k - t_1) / (k - 1)`` and the round trip ``t_1 -`` that. Values over :data:`PROBE_CAP` are timed at that
    size and their per-chunk cost scaled by size (loopback transfers are bandwidth bound at that size).
    Deserialize is what a retrieve does per chunk: decode the header, checksum the tensor bytes
    (xxh3_64), copy them into the prefix KV. With fp8 payloads (``kv_dtype``) serialize quantizes and deserialize
    dequantizes a chunk's worth of model-dtype values (one per stored byte).
    """
    size = store.value_bytes
    k, probe = probe_plan(size, room)
    value = os.urandom(64) * (probe // 64) + os.urandom(probe % 64)
    kv_dtype = store.config.kv_dtype
    itemsize = dtype_bytes(store.config.stored_dtype)
    data = bytearray(value[:probe - probe % itemsize])
    with_torch = "torch" in sys.modules  # a replay that runs no model never loads torch (~1 s, ~200 MiB) for this
    tensor = probe_tensor(data, store.config.dtype, kv_dtype) if with_torch else None
    # payload keys of the run's namespace, recorded in the store's ``written`` before they are written, so an
    # interrupted run's cleanup removes them too
    probes = [b"\xff" * 15 + bytes([i]) for i in range(k)] if wire else []
    store.written.add(PAYLOAD, probes)
    keys = [store.payload_key(h) for h in probes]
    times: dict[tuple[str, int], list[float]] = {}
    sers, desers = [], []
    encoded: memoryview | bytearray
    for repeat in range(4):  # the first round warms up (allocations, connection buffers): not kept
        for batch in (keys[:1], keys) if wire else ():
            t0 = time.perf_counter()
            pipe = client.pipeline(transaction=False)
            for key in batch:
                pipe.set(key, value)
            pipe.execute()
            t1 = time.perf_counter()
            cluster.mget(client, batch)
            t2 = time.perf_counter()
            if repeat:
                times.setdefault(("set", len(batch)), []).append(t1 - t0)
                times.setdefault(("get", len(batch)), []).append(t2 - t1)
        t3 = time.perf_counter()
        if tensor is not None:  # exactly when torch is loaded
            encoded = encode_kv(tensor, dtype=kv_dtype)
            t4 = time.perf_counter()
            decoded = cast("torch.Tensor", decode_kv(encoded, store.config.dtype)[0])  # a tensor, without a state
            xxhash.xxh3_64_digest(encoded[len(encoded) - decoded.numel() * itemsize:])
            decoded.clone()
        else:  # the same memory work without torch: header + one copy in, header parse + checksum + one copy out
            encoded = _copy_with_header(data)
            t4 = time.perf_counter()
            view = memoryview(encoded)[len(encoded) - len(data):]
            xxhash.xxh3_64_digest(view)
            bytearray(view)
        t5 = time.perf_counter()
        if repeat:
            sers.append(t4 - t3)
            desers.append(t5 - t4)
    scale = size / probe
    if not wire:
        spread = tuple(float(t / np.median(ts) - 1) for ts in (sers, desers) for t in ts)
        return ServerRates(0.0, 0.0, min(sers) * scale, min(desers) * scale, spread, wire=False)
    cluster.unlink(client, keys)
    rates = {}
    for op in ("set", "get"):
        one, many = min(times[(op, 1)]), min(times[(op, k)])
        per_chunk = max(0.0, (many - one) / (k - 1))
        rates[op] = (per_chunk * scale, max(0.0, one - per_chunk))
    spread = tuple(float(t / np.median(ts) - 1) for ts in times.values() for t in ts)
    return ServerRates(rates["set"][0], rates["get"][0], min(sers) * scale, min(desers) * scale, spread,
                       rates["set"][1], rates["get"][1])


def probe_tensor(data: bytearray, dtype, kv_dtype: str | None):
    """The calibration's tensor: a flat tensor of ``dtype`` over ``data`` (no copy); for a ``kv_dtype`` payload,
    ``[1, 1, len(data)]`` normal values of ``dtype`` (random bytes may be NaN, which fp8 cannot scale), one per
    stored byte."""
    import torch

    if kv_dtype is not None:
        return torch.randn(1, 1, len(data), generator=torch.Generator().manual_seed(0)).to(torch_dtype(dtype))
    return torch.frombuffer(data, dtype=torch_dtype(dtype))


def _copy_with_header(data: bytearray) -> bytearray:
    """What :func:`~kvcli.store.serde.encode_kv` does to a chunk's bytes, without torch: a safetensors-sized header
    (built the same way) followed by one copy of the data (bytes)."""
    head = b"\0" * 8 + b'{"kv":{"dtype":"BF16","shape":[%d],"data_offsets":[0,%d]}}' % (len(data), len(data))
    out = bytearray(len(head) + len(data))
    out[:len(head)] = head
    out[len(head):] = data
    return out


def ping_seconds(client: redis.Redis | RedisCluster, repeats: int = 5) -> float:
    """The server's round trip (seconds): the fastest of ``repeats`` PINGs."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        client.ping()
        best = min(best, time.perf_counter() - t0)
    return best
