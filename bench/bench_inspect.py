"""kvcli inspect: seconds to read 1,000,000 keys, without MEMORY USAGE and with ``--sample 1000``.

Starts a private embedded server on a free loopback port (never the machine's 6379) and fills it with ``--keys``
kvcli keys: half metadata, half payloads, in chains of 1,000 chunks (chunk size 16; real metadata values as
ChunkStore writes them, 64-byte stand-in payloads, so checksums are not verified here), plus ``--foreign`` foreign
keys. Then times ``inspect_cache(client, sample=0, verify=False)`` (no MEMORY USAGE) and ``sample=1000``, and
optionally (``--all-memory``) MEMORY USAGE of every key. Min and median over repeats (the machine is noisy).

    python bench/bench_inspect.py [--keys 1000000] [--foreign 0] [--repeats 2] [--all-memory]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import redis
import torch

from kvcli.live.inspect import inspect_cache
from kvcli.store.chunkstore import ChunkStore, chunk_metadata
from kvcli.store.records import StoreConfig
from kvcli.store.server import embedded_server

CHAIN = 1000


def fill(client: redis.Redis, keys: int, foreign: int) -> None:
    store = ChunkStore(client, StoreConfig("bench", 16, "kvcli/tiny@seed0:fp32", "cl100k_base", (2, 2, 2, 32),
                                           torch.float32))
    chunks, payload, done = keys // 2, b"\0" * 64, 0
    rng = np.random.default_rng(0)
    pipe = client.pipeline(transaction=False)
    for p in range(0, chunks, CHAIN):
        n = min(CHAIN, chunks - p)
        prompt = store.chunk(rng.integers(0, 100_000, n * 16, dtype=np.uint32))
        pairs = {}
        for k, h in enumerate(prompt.hashes):
            pairs[store.meta_key(h)] = chunk_metadata(store, prompt, k)
            pairs[store.payload_key(h)] = payload
        pipe.mset(pairs)
        done += 1
        if done % 10 == 0:
            pipe.execute()
    for start in range(0, foreign, 10_000):
        pipe.mset({f"app:{i}": i for i in range(start, min(start + 10_000, foreign))})
    pipe.execute()


def timed(client, runs: int, **kw) -> dict:
    seconds, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = inspect_cache(client, **kw)
        seconds.append(time.perf_counter() - t0)
    return {"best": min(seconds), "median": statistics.median(seconds), "kvcli_keys": result.kvcli_keys,
            "other_keys": result.other_keys, "memory_bytes": sum((g.memory_bytes or 0) for g in result.groups)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--foreign", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--all-memory", action="store_true")
    args = ap.parse_args()
    with embedded_server() as url:
        client = redis.Redis.from_url(url)
        t0 = time.perf_counter()
        fill(client, args.keys, args.foreign)
        print(f"filled {client.dbsize():,} keys in {time.perf_counter() - t0:.1f} s; used_memory "
              f"{client.info('memory')['used_memory'] / 2**20:,.0f} MiB")
        cases = [("no MEMORY USAGE", {"sample": 0}), ("--sample 1000", {"sample": 1000})]
        if args.all_memory:
            cases.append(("MEMORY USAGE of every key", {"sample": None}))
        for name, kw in cases:
            r = timed(client, args.repeats, verify=False, **kw)
            print(f"inspect, {name:<26} best {r['best']:6.1f} s, median {r['median']:6.1f} s  "
                  f"({r['kvcli_keys']:,} kvcli + {r['other_keys']:,} other keys; redis memory "
                  f"{r['memory_bytes'] / 2**20:,.0f} MiB)")


if __name__ == "__main__":
    main()
