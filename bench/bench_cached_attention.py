"""Suffix prefill after a cached prefix vs the full prefill: measured time ratio next to the exact FLOP ratio.

    python bench/bench_cached_attention.py                           # tiny and cpu presets, totals 2k/4k/8k
    python bench/bench_cached_attention.py --presets tiny --totals 2048 --repeats 2

For each prompt of ``total`` tokens and each cached share (0, 25, 50, 75, 94 %): "full" prefills all ``total``
tokens; "suffix" prefills the last ``new = total - cached`` after the KV of the first ``cached`` (taken from the full
prefill, untimed), as a cache hit would, with kvcli's attention (kvcli.model.attention: unmasked cached part plus a
causal block, merged by log-sum-exp); "old" is the same suffix through the explicit-mask attention kvcli used before.
Last-token logits only, as serving. The FLOP ratio is ``prefill_flops(new, cached) / prefill_flops(total, 0)``
(kvcli.model.flops): a suffix whose time tracks the work left has a time ratio near it. The pairs ratio is
attention's alone (causal (query, key) pairs). Where attention runs at fewer FLOP/s than the matrix multiplies (bf16
on this CPU: ~30 vs ~180 GFLOP/s, torch.profiler), the time ratio lies between the FLOP ratio and the pairs ratio.

Ratios: "min" is min(suffix) / min(full), the least-disturbed runs; "med" is median / median. All calls of one prompt
length are interleaved, so a slow spell of this noisy machine lands on every column. One torch thread by default
(``--threads``): on this 2-vCPU machine, shared with other jobs, two threads run 2-4x slower than one.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np
import torch

from kvcli.model.flops import attention_pairs, prefill_flops
from kvcli.model.llama import build_model

sys.path.insert(0, os.path.dirname(__file__))
from _common import interleaved


def _ratio(part: list[float], whole: list[float]) -> str:
    return f"{min(part) / min(whole):.2f}/{statistics.median(part) / statistics.median(whole):.2f}"


def _prefill(model, tokens, past=None, masked=False):
    def run():
        model._masked_attention = masked
        try:
            model.prefill(tokens, past)
            model.synchronize()
        finally:
            model._masked_attention = False
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["tiny", "cpu"])
    ap.add_argument("--dtype", default=None, help="default: each preset's own (tiny fp32, cpu bf16)")
    ap.add_argument("--totals", nargs="+", type=int, default=[2048, 4096, 8192])
    ap.add_argument("--shares", nargs="+", type=float, default=[0, 0.25, 0.5, 0.75, 0.94])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-old", action="store_true", help="skip the old explicit-mask path")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.repeats} repeats; "
          f"ratios are suffix / full, min/med")
    print(f"{'model':<24} {'total':>6} {'cached':>6} {'share':>5} {'new':>6} | {'full s min/med':>15} | "
          f"{'FLOP ratio':>10} {'pairs ratio':>11} | {'suffix ratio':>12} | {'old masked':>10}")
    for preset in args.presets:
        model = build_model(preset, dtype=args.dtype, device="cpu")
        tokens = np.random.default_rng(0).integers(0, model.config.vocab, max(args.totals), dtype=np.uint32)
        for total in args.totals:
            full_kv = model.prefill(tokens[:total])[1]
            splits = sorted({min(int(round(share * total)), total - 1) for share in args.shares})
            fns = [_prefill(model, tokens[:total])]
            for cached in splits:
                past = full_kv[:, :, :, :cached].clone() if cached else None
                fns.append(_prefill(model, tokens[cached:total], past))
                if not args.no_old:
                    fns.append(_prefill(model, tokens[cached:total], past, masked=True))
            times = interleaved(fns, args.repeats)
            full, rest = times[0], times[1:]
            per = 1 if args.no_old else 2
            for i, cached in enumerate(splits):
                new = total - cached
                flop_ratio = prefill_flops(model.config, new, cached) / prefill_flops(model.config, total, 0)
                pairs_ratio = attention_pairs(new, cached) / attention_pairs(total)
                old = "-" if args.no_old else _ratio(rest[per * i + 1], full)
                print(f"{model.model_id:<24} {total:>6} {cached:>6} {cached / total:>5.0%} {new:>6} | "
                      f"{min(full):>7.3f}/{statistics.median(full):<7.3f} | {flop_ratio:>10.2f} {pairs_ratio:>11.2f} | "
                      f"{_ratio(rest[per * i], full):>12} | {old:>10}", flush=True)
            del full_kv, fns


if __name__ == "__main__":
    main()
