"""Full prefill vs cached-prefix prefill on the local model: tokens/s, min and median of repeats, and the ratio.

    python bench/bench_prefill.py                       # cpu preset, fp32 and bf16, prompts 1024/2048/4096
    python bench/bench_prefill.py --lengths 512 1024 --new 128 --repeats 3 --dtypes bf16

For each prompt of L tokens: "full" prefills all L; "cached" prefills the last ``--new`` tokens after the KV of the
first L - new (computed once, untimed), as a cache hit would. tok/s counts the whole prompt (L tokens served per
second) in both, so the ratio is the prefill speed-up from the cache. Last-token logits only, as serving.
The machine is noisy: min is the least-disturbed run (near the hardware), median what the machine sustains.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

from kvcli.model.llama import build_model

sys.path.insert(0, os.path.dirname(__file__))
from _common import interleaved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048, 4096])
    ap.add_argument("--new", type=int, default=256, help="uncached tokens at the end of each prompt")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    print(f"{'model':<24} {'prompt':>6} {'cached':>6} | {'full s min/med':>15} {'full tok/s min/med':>19} | "
          f"{'cached s min/med':>16} {'cached tok/s min/med':>21} | {'ratio min/med':>13}")
    for dtype in args.dtypes:
        model = build_model(args.preset, dtype=dtype, device=args.device)
        tokens = np.random.default_rng(0).integers(0, model.config.vocab, max(args.lengths), dtype=np.uint32)
        for length in args.lengths:
            cached = length - min(args.new, length - 1)
            prefix_kv = model.prefill(tokens[:cached])[1]

            def full():
                model.prefill(tokens[:length])
                model.synchronize()

            def hit():
                model.prefill(tokens[cached:length], prefix_kv)
                model.synchronize()

            tf, tc = interleaved([full, hit], args.repeats)
            fmin, fmed, cmin, cmed = min(tf), statistics.median(tf), min(tc), statistics.median(tc)
            print(f"{model.model_id:<24} {length:>6} {cached:>6} | {fmin:>7.3f}/{fmed:<7.3f} "
                  f"{length / fmin:>9,.0f}/{length / fmed:<9,.0f} | {cmin:>8.3f}/{cmed:<7.3f} "
                  f"{length / cmin:>10,.0f}/{length / cmed:<10,.0f} | {fmin / cmin:>6.1f}/{fmed / cmed:<6.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
