"""Replay speed with the model estimated (no forward pass), and memory as the trace grows, on a Mooncake trace.

Baseline measured in the same run: reading the trace and chunk-hashing it at every chunk size, without Redis.
Memory: peak RSS of separate processes replaying the first 1,000 / 2,000 / 4,000 / all requests (without the
token-granular upper bound, whose radix tree holds every distinct token once, and with it).

    python bench/bench_replay.py [TRACE]    # default: ../shared/traces/mooncake/conversation_trace.first7500.jsonl
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[2] / "shared/traces/mooncake/conversation_trace.first7500.jsonl"
SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces/mooncake_conversation_head1000.jsonl.gz"
SIZES = (16, 64, 256, 1024)


def child(trace: str, limit: int, upper: bool) -> None:
    import resource

    from kvcli.costcurve import CostCurve
    from kvcli.model import ModelSpec
    from kvcli.replay import ReplayConfig, Replayer
    from kvcli.server import open_redis
    from kvcli.traces import read_trace
    import torch

    config = ReplayConfig(chunk_sizes=SIZES, payload="accounted", measure=0, limit=limit, upper_bound=upper)
    with open_redis(os.environ.get("REDIS_URL")) as (client, _):
        r = Replayer(client, None, CostCurve.from_tokens_per_second(1000), "cl100k_base", config,
                     spec=ModelSpec("m", (8, 2, 2, 64), torch.bfloat16))
        t0 = time.perf_counter()
        res = r.replay(trace, lambda: read_trace(trace))
        seconds = time.perf_counter() - t0
    tokens = res.per_chunk_size[0].prompt_tokens
    print(json.dumps({"requests": res.requests, "tokens": tokens, "seconds": seconds,
                      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def baseline(trace: str) -> tuple[int, int, float]:
    from kvcli.hashing import chunk_prompt, namespace_root
    from kvcli.traces import read_trace

    root = namespace_root("m", "cl100k_base")
    t0 = time.perf_counter()
    n = tokens = 0
    for req in read_trace(trace):
        for cs in SIZES:
            chunk_prompt(req.token_ids, cs, root)
        n += 1
        tokens += len(req.token_ids)
    return n, tokens, time.perf_counter() - t0


def run(trace: str, limit: int | None, upper: bool) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", trace, str(limit or 0), str(int(upper))],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    trace = sys.argv[1] if len(sys.argv) > 1 else str(DEFAULT if DEFAULT.exists() else SAMPLE)
    n, tokens, base = baseline(trace)
    print(f"{trace}: {n:,} requests, {tokens:,} tokens; chunk sizes {SIZES}")
    print(f"baseline (read + hash, no Redis): {n / base:,.0f} req/s, {tokens / base / 1e6:,.1f} M tokens/s")
    for limit in (1000, 2000, 4000, None):
        if limit and limit >= n:
            continue
        plain = run(trace, limit, False)
        full = run(trace, limit, True)
        print(f"first {plain['requests']:>5,} requests: replay {plain['requests'] / plain['seconds']:,.0f} req/s, "
              f"{plain['tokens'] / plain['seconds'] / 1e6:,.2f} M tokens/s "
              f"({plain['seconds'] / (base * plain['requests'] / n):.1f}x the baseline's time); "
              f"peak RSS {plain['rss_mib']:,.0f} MiB, with upper bound {full['rss_mib']:,.0f} MiB")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]) or None, sys.argv[4] == "1")
    else:
        main()
