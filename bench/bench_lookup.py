"""Lookup requests/s: kvcli's one-round-trip lookup vs LMCache 0.5.6's protocol (one EXISTS per chunk,
in order, to the first miss: kvcli.store.lmcache_store), and the cost of checking payloads,
same server, same run.

kvcli's lookup is one read-only script (EVAL_RO) that reads every chunk's metadata and, for chunks stored "real",
the payload's length, so a chunk whose payload was evicted or truncated is not a hit. Baselines: a bare MGET of
the metadata keys (one round trip, payloads unchecked: what the lookup was before), and the pipelined fallback
(MGET + one STRLEN per payload key, for servers that refuse scripts).

    python bench/bench_lookup.py            # embedded server on a free port
    REDIS_URL=redis://127.0.0.1:6390 python bench/bench_lookup.py
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import timed

from kvcli.store.chunkstore import ChunkStore
from kvcli.store.lmcache_store import LMCacheStore, purge_namespace
from kvcli.store.namespace import purge
from kvcli.store.records import StoreConfig
from kvcli.store.server import open_redis

CHUNK = 16
PROMPTS = 50


def main() -> None:
    with open_redis(os.environ.get("REDIS_URL")) as (client, target):
        print(f"server {target.display}; {PROMPTS} prompts per run, chunk size {CHUNK}, min / median of 5 runs")
        for chunks in (64, 1024):
            for stored in ("accounted", "real"):
                # a tiny KV shape (1 layer, 1 head, dim 1): 128-byte payloads, so real chunks fit in memory
                store = ChunkStore(client, StoreConfig(f"bench-lookup-{os.getpid()}", CHUNK, "m", "raw",
                                                       (1, 2, 1, 1), torch.float32))
                rng = np.random.default_rng(chunks)
                prompts = [store.chunk(rng.integers(0, 100000, CHUNK * chunks, dtype=np.uint32))
                           for _ in range(PROMPTS)]
                lmcache = LMCacheStore(client, store.config)
                for p in prompts:
                    kv = torch.zeros((1, 2, 1, CHUNK * chunks, 1)) if stored == "real" else None
                    store.store(p, kv)
                    if stored == "accounted":
                        lmcache.store(p, None)
                assert all(store.lookup(p).hit_chunks == chunks for p in prompts)
                rps = lambda t: PROMPTS / t  # noqa: E731
                fast = timed(lambda: [store.lookup(p) for p in prompts])
                mget = timed(lambda: [client.mget([store.meta_key(h) for h in p.hashes]) for p in prompts])
                unscripted = ChunkStore(client, store.config, scripts=False)
                piped = timed(lambda: [unscripted.lookup(p) for p in prompts])
                line = (f"{chunks:5d} chunks/prompt, {stored:9s}: lookup {rps(fast[0]):7.0f} / {rps(fast[1]):7.0f} "
                        f"req/s; bare MGET {rps(mget[0]):7.0f} / {rps(mget[1]):7.0f} (lookup costs "
                        f"{fast[0] / mget[0]:.2f}x / {fast[1] / mget[1]:.2f}x); pipelined fallback "
                        f"{rps(piped[0]):7.0f} / {rps(piped[1]):7.0f}")
                if stored == "accounted":
                    slow = timed(lambda: [lmcache.lookup(p) for p in prompts], repeats=3)
                    line += (f"; LMCache EXISTS per chunk {rps(slow[0]):6.1f} / {rps(slow[1]):6.1f} "
                             f"({slow[0] / fast[0]:.0f}x / {slow[1] / fast[1]:.0f}x slower)")
                print(line, flush=True)
                purge(client, store.config.namespace)
                purge_namespace(client, store.config.namespace)


if __name__ == "__main__":
    main()
