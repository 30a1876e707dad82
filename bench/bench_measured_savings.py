"""Does a substantial cache hit save measured prefill time? Every request of the sample traces measured.

Replays each sample trace with ``--measure all`` (the Mooncake sample: its first ``--mooncake-limit`` requests),
each measured request running its first ``--max-tokens`` tokens (``--measure-seconds`` large enough that the
budget never shortens them), and checks, per measured request and chunk size, that the cached path (suffix prefill
after the retrieved KV) took less time than the full prefill wherever the hit is substantial: at least 25 % of a
measured prompt of at least 1,024 tokens. The baseline, measured in the same run, is each request's own full
prefill; the ratio printed is suffix time / full time next to the FLOP ratio of the same split
(kvcli.model.flops), min and median over the substantial hits.

    python bench/bench_measured_savings.py
    python bench/bench_measured_savings.py --max-tokens 2048 --mooncake-limit 20
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvcli.model.flops import prefill_flops  # noqa: E402
from kvcli.model.presets import get_preset  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--mooncake-limit", type=int, default=30)
    ap.add_argument("--model", default="cpu")
    ns = ap.parse_args()
    config = get_preset(ns.model)
    rows, bad = [], []
    for trace in sorted((ROOT / "sample_traces").glob("*")):
        if trace.suffix not in (".json", ".jsonl", ".gz", ".traj"):
            continue
        args = [sys.executable, "-m", "kvcli", "replay", str(trace), "--measure", "all", "--model", ns.model,
                "--measure-max-tokens", str(ns.max_tokens), "--measure-seconds", "100000", "--json"]
        if "mooncake" in trace.name:
            args += ["--limit", str(ns.mooncake_limit)]
        doc = json.loads(subprocess.run(args, cwd=ROOT, check=True, capture_output=True, text=True).stdout)
        t = doc["traces"][0]
        for m in t["measured"]:
            n = m["measured_tokens"]
            for c in m["per_chunk_size"]:
                reused = c["reused_tokens"]
                if n >= 1024 and reused >= 0.25 * n:
                    suffix = m["full_prefill_seconds"] - c["saved_seconds"]
                    flops = float(prefill_flops(config, n - reused, reused) / prefill_flops(config, n, 0))
                    rows.append((trace.name, n, reused, c["chunk_size"], suffix / m["full_prefill_seconds"], flops))
                    if c["saved_seconds"] <= 0:
                        bad.append(rows[-1])
        print(f"{trace.name}: {t['measured_requests']} measured", flush=True)
    print(f"\n{len(rows)} substantial hits (>= 25% of a measured prompt of >= 1,024 tokens); "
          f"{len(rows) - len(bad)} saved time, {len(bad)} did not")
    if rows:
        ratios = [r[4] for r in rows]
        print(f"suffix / full time: min {min(ratios):.2f}, median {statistics.median(ratios):.2f}, "
              f"max {max(ratios):.2f}; FLOP ratio median {statistics.median(r[5] for r in rows):.3g}")
    for name, n, reused, cs, ratio, flops in bad:
        print(f"  NOT SAVED: {name} {reused}/{n} tokens at chunk size {cs}: time ratio {ratio:.2f}, "
              f"FLOP ratio {flops:.2f}")


if __name__ == "__main__":
    main()
