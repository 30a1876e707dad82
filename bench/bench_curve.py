"""Cost of the capacity/TTL curve as a share of the index-only replay, and its memory per distinct chunk.

Baseline measured in the same run: the same replay with ``--no-curve`` (``--payload accounted``, model estimated,
embedded server, chunk sizes 16/64/256/1024 together as in the main job). Runs alternate (no curve, curve after
write, curve after access) so the machine's load hits each alike. Reported, min and median over the repeats:

* the curve's own time (perf_counter around every ``HitCurve.observe`` / ``observe_many``) / the no-curve replay
  time: the share;
* (replay with curve - replay without) / replay without: the same share, measured end to end (noisier);
* the curve's memory (numpy state) per chunk size, and per distinct chunk.

    python bench/bench_curve.py [TRACE] [REPEATS] [--chunk-sizes 512]
    # default: the Mooncake sample (1,000 requests), 3 repeats, chunk sizes 16/64/256/1024
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces/mooncake_conversation_head1000.jsonl.gz"
SIZES = (16, 64, 256, 1024)


def replay(client, trace: str, curve: bool, refresh: bool = False, sizes: tuple[int, ...] = SIZES):
    import torch

    from kvcli.model.costcurve import CostCurve
    from kvcli.model.presets import ModelSpec
    from kvcli.replay.replayer import Replayer
    from kvcli.replay.results import ReplayConfig
    from kvcli.traces.detect import read_trace

    config = ReplayConfig(chunk_sizes=sizes, payload="accounted", measure=0, hit_curve=curve, ttl_refresh=refresh)
    r = Replayer(client, None, CostCurve.from_tokens_per_second(1000), "cl100k_base", config,
                 spec=ModelSpec("m", (8, 2, 2, 64), torch.bfloat16))
    requests = list(read_trace(trace))  # read once, outside the timing: the replay is what is compared
    t0 = time.perf_counter()
    res = r.replay(trace, requests)
    return time.perf_counter() - t0, res


def _mm(xs: list[float], spec: str = ".2f") -> str:
    return f"{min(xs):{spec}} / {statistics.median(xs):{spec}}"


def main() -> None:
    from kvcli.store.server import open_redis

    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=str(SAMPLE))
    ap.add_argument("repeats", nargs="?", type=int, default=3)
    ap.add_argument("--chunk-sizes", default=",".join(map(str, SIZES)))
    args = ap.parse_args()
    trace, repeats = args.trace, args.repeats
    sizes = tuple(int(x) for x in args.chunk_sizes.split(","))
    print(f"{trace}; index-only replay, chunk sizes {', '.join(map(str, sizes))}; {repeats} repeat(s); "
          f"min / median; load {os.getloadavg()[0]:.1f}")
    base, runs = [], {"after write": [], "after access": []}
    with open_redis(os.environ.get("REDIS_URL")) as (client, _):
        for _ in range(repeats):
            base.append(replay(client, trace, False, sizes=sizes)[0])
            for rule in runs:
                runs[rule].append(replay(client, trace, True, refresh=rule == "after access", sizes=sizes))
    print(f"replay without the curve: {_mm(base)} s")
    for rule, got in runs.items():
        total = [t for t, _ in got]
        own = [sum(r.hit_curve.seconds for r in res.per_chunk_size) for _, res in got]
        share = [o / b for o, b in zip(own, base)]
        end = [(t - b) / b for t, b in zip(total, base)]
        print(f"TTL {rule}: replay with the curve {_mm(total)} s; curve's own time {_mm(own)} s = "
              f"{_mm([100 * s for s in share], '.1f')}% of the replay without it "
              f"(end to end: {_mm([100 * e for e in end], '.1f')}%)")
        for r in got[-1][1].per_chunk_size:
            c = r.hit_curve
            print(f"  chunk size {r.chunk_size:5d}: {c.distinct_chunks:>9,} distinct chunks, curve memory "
                  f"{c.memory_bytes / 2**20:7.1f} MiB = {c.memory_bytes / max(c.distinct_chunks, 1):5.0f} B/chunk, "
                  f"curve time {c.seconds:.2f} s")


if __name__ == "__main__":
    main()
