"""torch threads: a prefill and the deserialization of its KV with 1 thread and with every core, in one run.

The default model (``cpu`` preset, bf16): a prefill of ``--tokens`` new tokens (default 2,200), then
deserializing its KV from chunk payloads (chunk size 256: ``decode_kv`` of each, ``torch.cat``), each timed
``--repeats`` times per thread count, thread counts interleaved. Prints min / median seconds and the ratio of every
count to 1 thread. kvcli's default (``--threads 1``) rests on this measurement.

    python bench/bench_threads.py [--tokens 2200] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--preset", default="cpu")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import os

    import numpy as np
    import torch

    from kvcli.model.llama import build_model
    from kvcli.store.serde import decode_kv, encode_kv

    model = build_model(args.preset, device="cpu")
    ids = np.random.default_rng(0).integers(0, model.config.vocab, args.tokens, dtype=np.uint32)
    _, kv = model.prefill(ids)
    payloads = [bytes(encode_kv(kv[:, :, :, i:i + 256].contiguous())) for i in range(0, args.tokens - 255, 256)]
    counts = sorted({1, len(os.sched_getaffinity(0))})
    prefill = {n: [] for n in counts}
    decode = {n: [] for n in counts}
    for _ in range(args.repeats):
        for n in counts:
            torch.set_num_threads(n)
            t0 = time.perf_counter()
            model.prefill(ids)
            t1 = time.perf_counter()
            torch.cat([decode_kv(p)[0] for p in payloads], dim=3).clone()
            t2 = time.perf_counter()
            prefill[n].append(t1 - t0)
            decode[n].append(t2 - t1)
    print(f"{args.preset} preset, {args.tokens}-token prefill and the deserialization of {len(payloads)} chunk "
          f"payloads of 256 tokens; {args.repeats} runs per thread count, interleaved; min / median seconds")
    for n in counts:
        p, d = prefill[n], decode[n]
        print(f"{n} thread(s): prefill {min(p):.3f} / {statistics.median(p):.3f} s "
              f"(x{min(p) / min(prefill[1]):.2f} / x{statistics.median(p) / statistics.median(prefill[1]):.2f} of 1)"
              f"; deserialize {min(d):.4f} / {statistics.median(d):.4f} s "
              f"(x{min(d) / min(decode[1]):.2f} / x{statistics.median(d) / statistics.median(decode[1]):.2f} of 1)")


if __name__ == "__main__":
    main()
