"""Speed of the routing simulator: requests/s per policy, before/after a change in one run (prints, asserts nothing).

Usage::

    python bench/bench_route.py [TRACE] [--ref REV] [--nodes N] [--capacity TOKENS] [--chunk-size C] [--limit L]
                                [--rounds K] [--repeats R] [--policies round-robin,prefix,...]

TRACE defaults to the 1,000-request Mooncake sample in sample_traces/ (``/work/shared/traces/mooncake/
conversation_trace.first7500.jsonl`` is a 7,500-request cut). Each policy simulates the trace on ``N`` nodes with
``TOKENS``-token caches (default 3M), prefill at 10,000 tokens/s, chunk size ``C`` (default 512), on the first ``L``
requests (default all). The cache-manager row includes its real Redis
round trips (embedded server); it is left out unless named in ``--policies``.

Every measurement runs in a fresh process (``--worker``) that reads and hashes the trace (timed apart: the
``read + hash`` line, with its ratio to a hash floor: one xxh3 pass over the same token bytes, read again untimed),
then times each policy ``R`` times. With ``--ref REV`` (e.g. the commit before a change),
the ``kvcli`` package of REV (``git archive``) is measured too, in alternating processes (``K`` rounds of each),
so a slow spell of this shared machine lands on both sides; the table gives min and median requests/s of each and
their ratios (after / before). Without ``--ref`` only this checkout is measured. Every process also times a floor
that does not depend on kvcli: a bare heap of the same event tuples (3 pushes and pops per request); ``x floor`` is
the simulation's time over that floor's, comparable between runs. The header gives the machine's load average
before and after the run.
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


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def hash_floor(trace: str, limit: int | None) -> dict[str, float]:
    """The work floor of reading and hashing: one xxh3-128 pass over every prompt's token bytes (``<u4``), read
    again beforehand (untimed) so that the tokens are in memory. ``{clock: seconds}``."""
    import itertools

    import xxhash

    from kvcli.model.tokenize import lazy_tokenizer
    from kvcli.store.hashing import as_token_array
    from kvcli.traces.detect import read_trace

    tokens = [as_token_array(r.token_ids) for r in itertools.islice(
        read_trace(trace, "auto", lazy_tokenizer("cl100k_base")[0]), limit)]
    digest = xxhash.xxh3_128_digest
    return timed(lambda: [digest(t.data) for t in tokens])[1]


def timed(fn) -> tuple[object, dict[str, float]]:
    """``(fn(), {clock: seconds it took})`` on each of :data:`CLOCKS`."""
    start = {name: clock() for name, clock in CLOCKS.items()}
    result = fn()
    return result, {name: clock() - start[name] for name, clock in CLOCKS.items()}


def worker(args) -> dict:
    """Time this process's kvcli (whatever ``PYTHONPATH`` puts first): per policy (and the floor), one
    ``{clock: seconds}`` per run."""
    from kvcli.model.costcurve import CostCurve
    from kvcli.route.policies import make_policy
    from kvcli.route.simulator import SimConfig, load_requests, simulate
    from kvcli.store.server import open_redis

    requests, load = timed(lambda: load_requests(args.trace, chunk_size=args.chunk_size, limit=args.limit))
    floor = hash_floor(args.trace, args.limit)
    config = SimConfig(nodes=args.nodes, capacity_tokens=args.capacity, chunk_size=args.chunk_size)
    cost = CostCurve.from_tokens_per_second(10_000)
    arrival = sorted(r.timestamp or 0.0 for r in requests)
    out = {"requests": len(requests), "chunks": sum(len(r.hashes) for r in requests), "load": load,
           "hash_floor": floor,
           "floor": [], "policies": {p: [] for p in args.policies}}
    with open_redis() if "cache-manager" in args.policies else nullcontext((None, None)) as (client, _):
        for _ in range(args.repeats):
            out["floor"].append(timed(lambda: heap_floor(arrival))[1])
            for name in args.policies:
                policy = make_policy(name, config, client)
                out["policies"][name].append(timed(lambda: simulate(requests, policy, config, cost))[1])
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
    """One worker process on the ``kvcli`` package under ``tree``."""
    cmd = [sys.executable, __file__, args.trace, "--worker", "--nodes", str(args.nodes), "--capacity",
           str(args.capacity), "--chunk-size", str(args.chunk_size), "--repeats", str(args.repeats), "--policies",
           ",".join(args.policies)] + (["--limit", str(args.limit)] if args.limit else [])
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=tree)
    return json.loads(done.stdout)


def merge(results: list[dict]) -> dict:
    """The runs of several worker processes of one side, pooled (load: the fastest process's)."""
    out = {**results[0], "floor": [], "policies": {p: [] for p in results[0]["policies"]}}
    for r in results:
        out["floor"] += r["floor"]
        out["load"] = min(out["load"], r["load"], key=lambda t: t["wall"])
        out["hash_floor"] = min(out["hash_floor"], r["hash_floor"], key=lambda t: t["wall"])
        for p, runs in r["policies"].items():
            out["policies"][p] += runs
    return out


def report(sides: dict[str, dict], args) -> None:
    """One table per clock: requests/s min and median per side, after/before ratios, after's time / floor's."""
    first = next(iter(sides.values()))
    n, names = first["requests"], list(sides)
    print(f"{Path(args.trace).name}: {n:,} requests, {first['chunks']:,} chunks of {args.chunk_size} tokens; "
          f"{args.nodes} nodes, {args.capacity:,}-token caches; {args.rounds} processes x {args.repeats} repeats "
          "per side")
    print(f"load average (1, 5, 15 min) on {os.cpu_count()} CPUs: {args.load_before} before, {args.load_after} after")
    for side, r in sides.items():
        floor = min(run["wall"] for run in r["floor"])
        read, hashing = r["load"], r["hash_floor"]
        print(f"{side}: read + hash {read['wall']:.2f} s wall, {read['cpu']:.2f} s CPU ({n / read['wall']:,.0f} "
              f"requests/s, fastest process; {read['cpu'] / hashing['cpu']:.0f}x the hash floor, one xxh3 pass over "
              f"the token bytes: {hashing['cpu']:.3f} s CPU); heap floor {n / floor:,.0f} requests/s (wall, min)")
    for clock, what in (("wall", "wall clock"), ("cpu", "CPU time of the process (discounts time the machine "
                                                         "gave to other jobs)")):
        head = "".join(f"{s + ' min':>14}{s + ' median':>16}" for s in names)
        ratio = f"{'ratio min':>11}{'ratio median':>14}" if len(names) == 2 else ""
        print(f"\nrequests/s, {what}\n{'policy':<15}{head}{ratio}{'x floor':>9}")
        for p in first["policies"]:
            row, speeds = f"{p:<15}", []
            for side in names:
                times = [run[clock] for run in sides[side]["policies"][p]]
                speeds.append((n / min(times), n / statistics.median(times)))
                row += f"{speeds[-1][0]:>14,.0f}{speeds[-1][1]:>16,.0f}"
            if len(speeds) == 2:
                row += f"{speeds[1][0] / speeds[0][0]:>11.2f}{speeds[1][1] / speeds[0][1]:>14.2f}"
            floor = min(run[clock] for run in sides[names[-1]]["floor"])
            print(f"{row}{n / speeds[-1][0] / floor:>9.1f}")


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    args.load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"now": str(ROOT)}
        if args.ref:
            trees = {"before": checkout(args.ref, tmp), "after": str(ROOT)}
        runs: dict[str, list[dict]] = {side: [] for side in trees}
        for _ in range(args.rounds):
            for side, tree in trees.items():
                runs[side].append(measure(tree, args))
        args.load_after = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        report({side: merge(r) for side, r in runs.items()}, args)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default=str(DEFAULT))
    ap.add_argument("--ref", help="git revision to compare against (its kvcli/ package)")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--capacity", type=int, default=3_000_000, help="tokens per node cache")
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--limit", type=int, help="only the first L requests")
    ap.add_argument("--rounds", type=int, default=3, help="processes per side")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each policy per process")
    ap.add_argument("--policies", type=lambda s: s.split(","), default=list(IN_PROCESS))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.trace = str(Path(args.trace).resolve())
    return args


if __name__ == "__main__":
    main()
