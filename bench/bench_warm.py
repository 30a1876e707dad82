"""kvcli warm: chunks/s and MB/s written, against ``redis-benchmark`` SET of the same value size on the same server.

Starts a private embedded server on a free loopback port (never the machine's 6379) and stops it at the end.
Per chunk size and repeat: warm ``--prompts`` distinct prompts of ``--tokens`` tokens with the tiny model into a
fresh namespace, then purge it; then ``redis-benchmark -t set -d <payload value bytes> -c 1`` with ``-P 1`` (one
request per round trip) and ``-P 16``, as many requests as warm wrote chunks. Reported:

* write path: chunks / ``write_seconds`` (serialize + MULTI/EXEC round trips) and value MB/s (payload, header and
  metadata bytes, MB = 10^6 B); its ratio to redis-benchmark's SET MB/s;
* end to end: chunks / total seconds (planning, prefill with the tiny model, writing).

Min and median over repeats (the machine is noisy). Usage::

    python bench/bench_warm.py [--chunk-sizes 16,64,256] [--prompts 32] [--tokens 1024] [--repeats 3] [--json]
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import statistics
import subprocess
from urllib.parse import urlsplit

import numpy as np
import redis

from kvcli.live.warm import WarmConfig, warm
from kvcli.model.llama import build_model
from kvcli.store.namespace import purge
from kvcli.store.server import embedded_server
from kvcli.traces.request import Request


def redis_benchmark_set(port: int, size: int, requests: int, pipeline: int) -> float:
    """SET ops/s of ``size``-byte values from redis-benchmark (one connection)."""
    exe = shutil.which("redis-benchmark") or "/usr/bin/redis-benchmark"
    out = subprocess.run([exe, "-h", "127.0.0.1", "-p", str(port), "-t", "set", "-d", str(size), "-n",
                          str(requests), "-c", "1", "-P", str(pipeline), "--csv"], check=True, capture_output=True,
                         text=True, timeout=600).stdout
    rows = [r for r in csv.reader(io.StringIO(out)) if r and r[0] == "SET"]
    return float(rows[0][1])


def run_size(client, port: int, model, cs: int, args) -> dict:
    rows = []
    for rep in range(args.repeats):
        rng = np.random.default_rng(1000 * cs + rep)
        prompts = [Request(str(i), rng.integers(0, 100_000, args.tokens, dtype=np.uint32))
                   for i in range(args.prompts)]
        ns = f"bench-{cs}-{rep}"
        res = warm(client, prompts, model, WarmConfig(ns, (cs,)))
        chunks, nbytes = res.total("chunks_written"), res.total("bytes")
        value = res.per_size[0].payload_bytes // max(res.per_size[0].payload_objects, 1) + (
            res.per_size[0].header_bytes // max(res.per_size[0].payload_objects, 1))
        purge(client, ns)
        p1 = redis_benchmark_set(port, value, chunks, 1)
        p16 = redis_benchmark_set(port, value, chunks, 16)
        rows.append({"chunks": chunks, "value_bytes": value, "mb": nbytes / 1e6,
                     "write_chunks_s": chunks / res.write_seconds, "write_mb_s": nbytes / 1e6 / res.write_seconds,
                     "e2e_chunks_s": chunks / res.seconds, "e2e_mb_s": nbytes / 1e6 / res.seconds,
                     "bench_p1_mb_s": p1 * value / 1e6, "bench_p16_mb_s": p16 * value / 1e6,
                     "bench_p1_ops_s": p1, "bench_p16_ops_s": p16})
    out = {"chunk_size": cs, "value_bytes": rows[0]["value_bytes"], "chunks_per_run": rows[0]["chunks"]}
    for key in rows[0]:
        if key.endswith("_s"):
            vals = [r[key] for r in rows]
            out[key] = {"best": max(vals), "median": statistics.median(vals)}
    for p in ("p1", "p16"):
        out[f"ratio_write_vs_{p}"] = {
            "best": out["write_mb_s"]["best"] / out[f"bench_{p}_mb_s"]["best"],
            "median": out["write_mb_s"]["median"] / out[f"bench_{p}_mb_s"]["median"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk-sizes", default="16,64,256")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = build_model("tiny", device="cpu")
    with embedded_server() as url:
        client = redis.Redis.from_url(url)
        port = urlsplit(url).port
        results = [run_size(client, port, model, int(cs), args) for cs in args.chunk_sizes.split(",")]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"tiny model (1,024 KV bytes/token), {args.prompts} prompts x {args.tokens} tokens, best / median of "
          f"{args.repeats}")
    print("chunk  value B   warm write chunks/s   warm write MB/s   redis-benchmark SET MB/s (P1 | P16)   "
          "ratio vs P1 | P16   warm end-to-end chunks/s")
    for r in results:
        def f(k: str, r=r) -> str:
            return f"{r[k]['best']:,.0f} / {r[k]['median']:,.0f}"

        def g(k: str, r=r) -> str:
            return f"{r[k]['best']:.2f} / {r[k]['median']:.2f}"

        print(f"{r['chunk_size']:>5}  {r['value_bytes']:>7,}   {f('write_chunks_s'):>19}   {f('write_mb_s'):>15}   "
              f"{f('bench_p1_mb_s'):>15} | {f('bench_p16_mb_s'):<15}   {g('ratio_write_vs_p1')} | "
              f"{g('ratio_write_vs_p16')}   {f('e2e_chunks_s')}")


if __name__ == "__main__":
    main()
