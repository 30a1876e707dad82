"""Lookup requests/s: kvcli's one-round-trip lookup (one MGET) vs LMCache 0.5.6's protocol (one EXISTS per chunk,
in order, to the first miss: kvcli.store.lmcache_store), every chunk a hit, same server, same run.

    python bench/bench_lookup.py            # embedded server on a free port
    REDIS_URL=redis://127.0.0.1:6390 python bench/bench_lookup.py
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import timed  # noqa: E402

from kvcli.store.chunkstore import ChunkStore, StoreConfig  # noqa: E402
from kvcli.store.lmcache_store import LMCacheStore, purge_namespace  # noqa: E402
from kvcli.store.namespace import purge  # noqa: E402
from kvcli.store.server import open_redis  # noqa: E402

CHUNK = 16
PROMPTS = 50


def main() -> None:
    with open_redis(os.environ.get("REDIS_URL")) as (client, target):
        print(f"server {target.display}; {PROMPTS} prompts per run, chunk size {CHUNK}, min / median of 5 runs")
        for chunks in (64, 1024):
            config = StoreConfig(f"bench-lookup-{os.getpid()}", CHUNK, "m", "raw", (2, 2, 2, 32), torch.float32)
            store, lmcache = ChunkStore(client, config), LMCacheStore(client, config)
            rng = np.random.default_rng(chunks)
            prompts = [store.chunk(rng.integers(0, 100000, CHUNK * chunks, dtype=np.uint32)) for _ in range(PROMPTS)]
            for p in prompts:
                store.store(p, None)
                lmcache.store(p, None)
            assert all(store.lookup(p).hit_chunks == lmcache.lookup(p).hit_chunks == chunks for p in prompts)
            fast = timed(lambda: [store.lookup(p) for p in prompts])
            slow = timed(lambda: [lmcache.lookup(p) for p in prompts], repeats=3)
            rps = lambda t: PROMPTS / t  # noqa: E731
            print(f"{chunks:5d} chunks/prompt: MGET lookup {rps(fast[0]):8.0f} / {rps(fast[1]):8.0f} req/s; "
                  f"LMCache EXISTS per chunk {rps(slow[0]):6.1f} / {rps(slow[1]):6.1f} req/s; "
                  f"ratio {slow[0] / fast[0]:.0f}x (min) / {slow[1] / fast[1]:.0f}x (median)")
            purge(client, config.namespace)
            purge_namespace(client, config.namespace)


if __name__ == "__main__":
    main()
