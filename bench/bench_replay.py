"""Replay speed with the model estimated (no forward pass), and memory as the trace grows, on a Mooncake trace.

Baseline measured in the same run: reading the trace and chunk-hashing it, without Redis.
Speed: each chunk size alone over the whole trace (index-only mode, ``--payload accounted``).
Memory: peak RSS of separate processes replaying the first 1,000 / 2,000 / 4,000 / all requests at chunk sizes
64 and 256 (without the token-granular upper bound, whose radix tree holds every distinct token once, and with it).

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


def child(trace: str, limit: int, upper: bool, sizes: tuple[int, ...]) -> None:
    import resource

    import torch

    from kvcli.model.costcurve import CostCurve
    from kvcli.model.presets import ModelSpec
    from kvcli.replay.replayer import Replayer
    from kvcli.replay.results import ReplayConfig
    from kvcli.store.server import open_redis
    from kvcli.traces.detect import read_trace

    config = ReplayConfig(chunk_sizes=sizes, payload="accounted", measure=0, limit=limit, upper_bound=upper)
    with open_redis(os.environ.get("REDIS_URL")) as (client, _):
        r = Replayer(client, None, CostCurve.from_tokens_per_second(1000), "cl100k_base", config,
                     spec=ModelSpec("m", (8, 2, 2, 64), torch.bfloat16))
        t0 = time.perf_counter()
        res = r.replay(trace, lambda: read_trace(trace))
        seconds = time.perf_counter() - t0
    tokens = res.per_chunk_size[0].prompt_tokens
    print(json.dumps({"requests": res.requests, "tokens": tokens, "seconds": seconds,
                      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def baseline(trace: str, sizes: tuple[int, ...]) -> tuple[int, int, float]:
    from kvcli.store.hashing import chunk_prompt, namespace_root
    from kvcli.traces.detect import read_trace

    root = namespace_root("m", "cl100k_base")
    t0 = time.perf_counter()
    n = tokens = 0
    for req in read_trace(trace):
        for cs in sizes:
            chunk_prompt(req.token_ids, cs, root)
        n += 1
        tokens += len(req.token_ids)
    return n, tokens, time.perf_counter() - t0


def run(trace: str, limit: int | None, upper: bool, sizes: tuple[int, ...]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", trace, str(limit or 0), str(int(upper)),
                          ",".join(map(str, sizes))], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    trace = sys.argv[1] if len(sys.argv) > 1 else str(DEFAULT if DEFAULT.exists() else SAMPLE)
    print(f"{trace}; index-only replay (--payload accounted), model estimated, embedded server")
    for cs in SIZES:
        n, tokens, base = baseline(trace, (cs,))
        r = run(trace, None, False, (cs,))
        print(f"chunk size {cs:5d}: {r['requests']:,} requests in {r['seconds']:.1f} s = "
              f"{r['requests'] / r['seconds']:,.0f} req/s, {r['tokens'] / r['seconds'] / 1e6:,.1f} M tokens/s; "
              f"baseline read + hash {n / base:,.0f} req/s (replay takes {r['seconds'] / base:.1f}x its time)")
    for limit in (1000, 2000, 4000, None):
        plain = run(trace, limit, False, (64, 256))
        full = run(trace, limit, True, (64, 256))
        print(f"first {plain['requests']:>5,} requests, chunk sizes 64+256: peak RSS {plain['rss_mib']:,.0f} MiB; "
              f"with the upper bound's radix tree {full['rss_mib']:,.0f} MiB")
        if limit is None or plain["requests"] < limit:
            break


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]) or None, sys.argv[4] == "1", tuple(int(x) for x in sys.argv[5].split(",")))
    else:
        main()
