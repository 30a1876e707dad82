"""Speed of the routing simulator: requests/s per policy on the Mooncake sample (prints a table, asserts nothing).

Usage: ``python bench/bench_route.py [TRACE] [--nodes N] [--repeats R]`` (default: the 1,000-request Mooncake sample
in sample_traces/; ``/work/shared/traces/mooncake/conversation_trace.first7500.jsonl`` is the 7,500-request cut).
Reading and hashing the trace is timed once, apart; then each policy's simulation runs ``R`` times on 4 nodes with
3M-token caches and prefill at 10,000 tokens/s, chunk size 512. The cache-manager rows include their real Redis
round trips (embedded server). This machine is noisy (shared/MEASURED.md): best and median are both printed.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from kvcli.model.costcurve import CostCurve
from kvcli.route.policies import POLICIES, make_policy
from kvcli.route.simulator import SimConfig, load_requests, simulate
from kvcli.store.server import open_redis

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "sample_traces" / "mooncake_conversation_head1000.jsonl.gz"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default=str(DEFAULT))
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    t0 = time.perf_counter()
    requests = load_requests(args.trace, chunk_size=512)
    load_s = time.perf_counter() - t0
    chunks = sum(len(r.hashes) for r in requests)
    print(f"{Path(args.trace).name}: {len(requests):,} requests, {chunks:,} chunks; read + hash {load_s:.2f} s "
          f"({len(requests) / load_s:,.0f} requests/s)")
    config = SimConfig(nodes=args.nodes, capacity_tokens=3_000_000, chunk_size=512)
    cost = CostCurve.from_tokens_per_second(10_000)
    print(f"{'policy':<15}{'best req/s':>12}{'median req/s':>14}{'best s':>9}")
    with open_redis() as (client, _):
        for name in POLICIES:
            times = []
            for _ in range(args.repeats):
                policy = make_policy(name, config, client)
                start = time.perf_counter()
                simulate(requests, policy, config, cost)
                times.append(time.perf_counter() - start)
                policy.close()
            best, median = min(times), statistics.median(times)
            print(f"{name:<15}{len(requests) / best:>12,.0f}{len(requests) / median:>14,.0f}{best:>9.3f}")


if __name__ == "__main__":
    main()
