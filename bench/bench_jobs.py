"""Replay throughput with 1..N workers: worker processes (``--jobs``) and Ray tasks on a local instance (``--ray``).

The Mooncake sample (1,000 requests), several chunk sizes, index-only (``--payload accounted --measure 0
--prefill-tps 10000``), against one embedded server; each run is a whole ``run_replay`` (validation, preflight,
transfer calibration, the units, merge, purge), so the worker processes' start (spawn, imports) is in every
``--jobs`` run; Ray's workers stay up between runs (its instance starts once, outside the timings). Calls are
interleaved (bench/_common.py); ratios are against 1 worker process measured in the same run. The merged hit tokens
are checked identical across all.

Baseline, measured in the same run: the CPU-bound part alone (read the trace and chunk-hash it at every chunk size,
no Redis) in 1..N processes of a pool started beforehand: the parallelism this machine gives at the moment (other
work on it, and the Redis server during a replay, share its cores).

    PYTHONPATH=. python bench/bench_jobs.py [--workers 2] [--repeats 3] [--chunk-sizes 64,128,256,512] [--no-ray]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_traces/mooncake_conversation_head1000.jsonl.gz"


def hash_unit(trace: str, sizes: tuple[int, ...]) -> int:
    """Read the trace and chunk-hash every prompt at ``sizes``; the chunks hashed."""
    from kvcli.store.hashing import chunk_prompt, namespace_root
    from kvcli.traces.detect import read_trace

    root, chunks = namespace_root("m", "cl100k_base"), 0
    for request in read_trace(trace):
        for cs in sizes:
            chunks += len(chunk_prompt(request.token_ids, cs, root).hashes)
    return chunks


def hashing_baseline(trace: str, sizes: tuple[int, ...], workers: int, repeats: int) -> list[list[float]]:
    """Seconds of :func:`hash_unit` over ``sizes`` split into 1..``workers`` processes (a started pool each)."""
    import multiprocessing

    from kvcli.replay.work import plan_units

    pools = [multiprocessing.get_context("spawn").Pool(n) for n in range(1, workers + 1)]
    try:
        def run(n: int):
            plan = plan_units(tuple(("kvcli", cs) for cs in sizes), n, False)
            return lambda: [r.get() for r in [pools[n - 1].apply_async(hash_unit, (trace, tuple(sizes[i] for i in idx)))
                                              for idx, _ in plan]]
        return interleaved([run(n) for n in range(1, workers + 1)], repeats)
    finally:
        for pool in pools:
            pool.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-sizes", default="64,128,256,512")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("trace", nargs="?", default=str(SAMPLE))
    args = ap.parse_args()

    from kvcli.replay.results import ReplayConfig
    from kvcli.replay.runner import ModelOptions, run_replay
    from kvcli.store.server import open_redis

    config = ReplayConfig(chunk_sizes=tuple(int(x) for x in args.chunk_sizes.split(",")), payload="accounted",
                          measure=0)
    options = ModelOptions("cpu", prefill_tps=10_000.0)
    hits: dict[str, list[int]] = {}
    ray = None
    if not args.no_ray:
        try:
            import ray
        except ImportError:
            print("Ray not installed (pip install 'kvcli[ray]'): Ray rows skipped")
    with open_redis(None) as (client, target):
        def one(label: str, **kw):
            def call():
                results, _ = run_replay(client, target, [Path(args.trace)], config, options, **kw)
                hits.setdefault(label, [r.hit_tokens for r in results[0].per_chunk_size])
                assert hits[label] == hits["jobs 1"], (label, hits[label], hits["jobs 1"])
            return call

        labels = [f"jobs {n}" for n in range(1, args.workers + 1)]
        fns = [one(f"jobs {n}", jobs=n) for n in range(1, args.workers + 1)]
        if ray is not None:
            ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
            labels += [f"ray {n}" for n in range(1, args.workers + 1)]
            fns += [one(f"ray {n}", ray="local", jobs=n) for n in range(1, args.workers + 1)]
        try:
            times = interleaved(fns, args.repeats)
        finally:
            if ray is not None:
                ray.shutdown()
    sizes = tuple(int(x) for x in args.chunk_sizes.split(","))
    labels += [f"hash {n}" for n in range(1, args.workers + 1)]
    times += hashing_baseline(args.trace, sizes, args.workers, args.repeats)
    base_min, base_med = min(times[0]), statistics.median(times[0])
    print(f"trace {Path(args.trace).name}, chunk sizes {args.chunk_sizes}, {os.cpu_count()} cores, "
          f"{args.repeats} runs each after a warm-up; hit tokens identical: {hits['jobs 1']}")
    print(f"{'workers':<10}{'min s':>8}{'median s':>10}{'speed-up (min)':>16}{'speed-up (median)':>19}")
    hash_at = labels.index("hash 1")
    for k, (label, t) in enumerate(zip(labels, times)):
        if k == hash_at:
            print("baseline: read + chunk-hash only, no Redis (ratios against hash 1)")
            base_min, base_med = min(t), statistics.median(t)
        lo, med = min(t), statistics.median(t)
        print(f"{label:<10}{lo:>8.2f}{med:>10.2f}{base_min / lo:>15.2f}x{base_med / med:>18.2f}x")


if __name__ == "__main__":
    main()
