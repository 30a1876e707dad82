"""Replay throughput with 1..N workers: worker processes (``--jobs``) and Ray tasks on a local instance (``--ray``).

The Mooncake sample (1,000 requests), several chunk sizes, index-only (``--payload accounted --measure 0
--prefill-tps 10000``), against one embedded server; each run is a whole ``run_replay`` (validation, preflight,
transfer calibration, the units, merge, purge), so the worker processes' start (spawn, imports) is in every
``--jobs`` run; Ray's workers stay up between runs (its instance starts once, outside the timings). Calls are
interleaved (bench/_common.py); ratios are against 1 worker process measured in the same run. The merged hit tokens
are checked identical across all.

    PYTHONPATH=. python bench/bench_jobs.py [--workers 2] [--repeats 3] [--chunk-sizes 64,128,256,512] [--no-ray]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_traces/mooncake_conversation_head1000.jsonl.gz"


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
    base_min, base_med = min(times[0]), statistics.median(times[0])
    print(f"trace {Path(args.trace).name}, chunk sizes {args.chunk_sizes}, {os.cpu_count()} cores, "
          f"{args.repeats} runs each after a warm-up; hit tokens identical: {hits['jobs 1']}")
    print(f"{'workers':<10}{'min s':>8}{'median s':>10}{'speed-up (min)':>16}{'speed-up (median)':>19}")
    for label, t in zip(labels, times):
        lo, med = min(t), statistics.median(t)
        print(f"{label:<10}{lo:>8.2f}{med:>10.2f}{base_min / lo:>15.2f}x{base_med / med:>18.2f}x")


if __name__ == "__main__":
    main()
