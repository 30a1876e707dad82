"""``--jobs``: the same replay with 1, 2, ... processes (chunk sizes split over them), wall time and speed-up in one run.

Index-only replay (``--payload accounted --measure 0``) of a Mooncake trace at chunk sizes 16, 64, 256 and 1024 by
default, each job count run ``--repeats`` times, interleaved, as a separate ``python -m kvcli replay`` process
against one server started here. Prints min / median wall seconds, requests/s, the speed-up over ``--jobs 1`` in
this run, and checks that every run found the same hit tokens.

    python bench/bench_jobs.py [--trace PATH] [--limit 3000] [--jobs 1,2] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = Path("/work/shared/traces/mooncake/conversation_trace.first7500.jsonl")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(DEFAULT))
    ap.add_argument("--limit", type=int, default=3000)
    ap.add_argument("--chunk-sizes", default="16,64,256,1024")
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from kvcli.model.threads import cores
    from kvcli.store.server import embedded_server

    counts = [int(x) for x in args.jobs.split(",")]
    times: dict[int, list[float]] = {n: [] for n in counts}
    hits: dict[int, set] = {n: set() for n in counts}
    requests = 0
    with embedded_server() as url:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": url}
        for _ in range(args.repeats):
            for n in counts:
                cmd = [sys.executable, "-m", "kvcli", "replay", args.trace, "--payload", "accounted", "--measure",
                       "0", "--prefill-tps", "3000", "--chunk-sizes", args.chunk_sizes, "--limit", str(args.limit),
                       "--no-upper-bound", "--jobs", str(n), "--json"]
                t0 = time.perf_counter()
                out = subprocess.run(cmd, env=env, capture_output=True, check=True).stdout
                times[n].append(time.perf_counter() - t0)
                doc = json.loads(out)
                requests = doc["traces"][0]["requests"]
                hits[n].add(tuple(r["hit_tokens"] for r in doc["traces"][0]["per_chunk_size"]))
    base = min(times[counts[0]]), statistics.median(times[counts[0]])
    print(f"index-only replay of {Path(args.trace).name} (first {args.limit:,} requests), chunk sizes "
          f"{args.chunk_sizes}, {args.repeats} runs per job count, interleaved; {cores()} cores; wall seconds of "
          f"the whole process")
    for n in counts:
        lo, med = min(times[n]), statistics.median(times[n])
        print(f"--jobs {n}: {lo:6.2f} / {med:6.2f} s   {requests / lo:7.0f} / {requests / med:7.0f} req/s   "
              f"speed-up {base[0] / lo:4.2f}x / {base[1] / med:4.2f}x   hit tokens {sorted(hits[n])}")
    assert len({h for s in hits.values() for h in s}) == 1, "job counts disagree"


if __name__ == "__main__":
    main()
