"""Speed of the routing simulator: requests/s per policy, before/after a change in one run (prints, asserts nothing).

Usage::

    python bench/bench_route.py [TRACE] [--ref REV] [--nodes N] [--capacity TOKENS] [--rounds K] [--repeats R]
                                [--policies round-robin,prefix,...]

TRACE defaults to the 1,000-request Mooncake sample in sample_traces/ (``/work/shared/traces/mooncake/
conversation_trace.first7500.jsonl`` is a 7,500-request cut). Each policy simulates the trace on ``N`` nodes with
``TOKENS``-token caches, prefill at 10,000 tokens/s, chunk size 512. The cache-manager row includes its real Redis
round trips (embedded server); it is left out unless named in ``--policies``.

Every measurement runs in a fresh process (``--worker``) that reads and hashes the trace (timed apart: the
``read + hash`` line), then times each policy ``R`` times. With ``--ref REV`` (e.g. the commit before a change),
the ``kvcli`` package of REV (``git archive``) is measured too, in alternating processes (``K`` rounds of each),
so a slow spell of this shared machine lands on both sides; the table gives min and median requests/s of each and
their ratios (after / before). Without ``--ref`` only this checkout is measured. Every process also times a floor
that does not depend on kvcli: a bare heap of the same event tuples (3 pushes and pops per request); ``x floor`` is
the simulation's time over that floor's, comparable between runs.
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "sample_traces" / "mooncake_conversation_head1000.jsonl.gz"
IN_PROCESS = ("round-robin", "least-loaded", "random", "prefix", "cache-aware", "cost")


def heap_floor(arrival: list[float]) -> None:
    """The least an event loop can do per request: three heap pushes and pops of 5-tuples, no cache, no policy."""
    heap, seq = [], 0
    for i, t in enumerate(arrival):
        for kind in (3, 0, 1):
            seq += 1
            heapq.heappush(heap, (t + 0.001 * kind, kind, seq, i, None))
        while heap and heap[0][0] <= t:
            heapq.heappop(heap)
    while heap:
        heapq.heappop(heap)


def worker(args) -> dict:
    """Time this process's kvcli (whatever ``PYTHONPATH`` puts first); returns seconds per run, per policy."""
    from kvcli.model.costcurve import CostCurve
    from kvcli.route.policies import make_policy
    from kvcli.route.simulator import SimConfig, load_requests, simulate

    start = time.perf_counter()
    requests = load_requests(args.trace, chunk_size=512)
    load_s = time.perf_counter() - start
    config = SimConfig(nodes=args.nodes, capacity_tokens=args.capacity, chunk_size=512)
    cost = CostCurve.from_tokens_per_second(10_000)
    arrival = sorted(r.timestamp or 0.0 for r in requests)
    out = {"requests": len(requests), "chunks": sum(len(r.hashes) for r in requests), "load_s": load_s,
           "floor": [], "policies": {p: [] for p in args.policies}}
    from kvcli.store.server import open_redis

    with open_redis() if "cache-manager" in args.policies else nullcontext((None, None)) as (client, _):
        for _ in range(args.repeats):
            start = time.perf_counter()
            heap_floor(arrival)
            out["floor"].append(time.perf_counter() - start)
            for name in args.policies:
                policy = make_policy(name, config, client)
                start = time.perf_counter()
                simulate(requests, policy, config, cost)
                out["policies"][name].append(time.perf_counter() - start)
                policy.close()
    return out


def checkout(rev: str, into: str) -> str:
    """``kvcli/`` of git revision ``rev`` extracted under ``into``; returns the folder to put on PYTHONPATH."""
    archive = Path(into) / "ref.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "kvcli"], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(tree: str, args) -> dict:
    cmd = [sys.executable, __file__, args.trace, "--worker", "--nodes", str(args.nodes), "--capacity",
           str(args.capacity), "--repeats", str(args.repeats), "--policies", ",".join(args.policies)]
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=tree)
    return json.loads(done.stdout)


def merge(results: list[dict]) -> dict:
    out = {**results[0], "floor": [], "policies": {p: [] for p in results[0]["policies"]}}
    for r in results:
        out["floor"] += r["floor"]
        out["load_s"] = min(out["load_s"], r["load_s"])
        for p, times in r["policies"].items():
            out["policies"][p] += times
    return out


def report(sides: dict[str, dict], args) -> None:
    first = next(iter(sides.values()))
    n = first["requests"]
    print(f"{Path(args.trace).name}: {n:,} requests, {first['chunks']:,} chunks; {args.nodes} nodes, "
          f"{args.capacity:,}-token caches; {args.rounds} processes x {args.repeats} repeats per side")
    for side, r in sides.items():
        floor = min(r["floor"])
        print(f"{side}: read + hash {r['load_s']:.2f} s ({n / r['load_s']:,.0f} requests/s, best process); "
              f"heap floor {n / floor:,.0f} requests/s (min)")
    names = list(sides)
    head = "".join(f"{s + ' min':>16}{s + ' median':>18}{'x floor':>9}" for s in names)
    ratio_head = f"{'ratio min':>11}{'ratio median':>14}" if len(names) == 2 else ""
    print(f"{'policy':<15}{head}{ratio_head}   (requests/s)")
    for p in first["policies"]:
        row, speeds = f"{p:<15}", []
        for side in names:
            times, floor = sides[side]["policies"][p], min(sides[side]["floor"])
            best, median = min(times), statistics.median(times)
            speeds.append((n / best, n / median))
            row += f"{n / best:>16,.0f}{n / median:>18,.0f}{best / floor:>9.1f}"
        if len(speeds) == 2:
            row += f"{speeds[1][0] / speeds[0][0]:>11.2f}{speeds[1][1] / speeds[0][1]:>14.2f}"
        print(row)


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"after": str(ROOT)}
        if args.ref:
            trees = {"before": checkout(args.ref, tmp), "after": str(ROOT)}
        runs: dict[str, list[dict]] = {side: [] for side in trees}
        for _ in range(args.rounds):
            for side, tree in trees.items():
                runs[side].append(measure(tree, args))
        report({side: merge(r) for side, r in runs.items()}, args)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default=str(DEFAULT))
    ap.add_argument("--ref", help="git revision to compare against (its kvcli/ package)")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--capacity", type=int, default=3_000_000, help="tokens per node cache")
    ap.add_argument("--rounds", type=int, default=3, help="processes per side")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each policy per process")
    ap.add_argument("--policies", type=lambda s: s.split(","), default=list(IN_PROCESS))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.trace = str(Path(args.trace).resolve())
    return args


if __name__ == "__main__":
    main()
