"""Prefill savings on a GPU: full prefill vs prefill after a cached prefix, for llama-3-8b-shaped KV or a checkpoint.

    python bench/bench_gpu_prefill.py                                  # llama-3-8b preset, bf16, cuda
    python bench/bench_gpu_prefill.py --model ~/models/Llama-3.1-8B-Instruct --lengths 2048 8192
    python bench/bench_gpu_prefill.py --model tiny --device cpu --lengths 256 512 --repeats 2   # smoke test

For each prompt of L tokens and each cached share h: "full" prefills all L tokens; "cached" prefills the last
L - c tokens (c = h * L) after the first c tokens' KV, which is already on the device (KV kept in GPU memory);
"cached+copy" first copies that KV from host memory (a pageable CPU tensor, as kvcli's store returns it), the
path of a KV cache in Redis. Every timing synchronizes the device before starting the clock and after the work
(``model.synchronize()``), so queued kernels never fall into or out of a measurement. Last-token logits only, as
serving. Printed: min and median seconds of ``--repeats`` interleaved runs, the saving (full - cached) and the
speed-up full / cached next to the FLOP ratio (the most a cache can give; formula below), the host-to-device copy
alone, and the largest |logit| difference cached vs full (the correctness check).

FLOPs of prefilling n tokens after c cached (matrix multiplies only, 2 per multiply-add):
``n * 2 * layers * (hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * ffn)`` (projections, SwiGLU)
``+ 4 * layers * heads * head_dim * n * (c + (n + 1) / 2)`` (QK^T and PV over causal pairs)
``+ 2 * vocab * hidden`` (the LM head on the last token).

The weights of a preset are random: its timing is a real model's shape, not its outputs. Until this script has
run on a GPU, kvcli's CUDA path is untested (README).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from kvcli.model.checkpoint import is_checkpoint_name
from kvcli.model.load import load_model


def flops(config, new: int, cached: int) -> float:
    """Matrix-multiply FLOPs of prefilling ``new`` tokens after ``cached`` (module docstring)."""
    c = config
    linear = 2 * c.layers * (c.hidden * c.head_dim * (2 * c.heads + 2 * c.kv_heads) + 3 * c.hidden * c.ffn)
    attention = 4 * c.layers * c.heads * c.head_dim * new * (cached + (new + 1) / 2)
    return new * linear + attention + 2 * c.vocab * c.hidden


def timed(model, fn, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn`` after one warm-up, each between two device synchronizations."""
    fn()
    out = []
    for _ in range(repeats):
        model.synchronize()
        t0 = time.perf_counter()
        fn()
        model.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-3-8b", help="preset or Hugging Face checkpoint folder")
    ap.add_argument("--dtype", default=None, help="default: bf16 for presets, the checkpoint's own otherwise")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lengths", nargs="+", type=int, default=[1024, 4096, 8192])
    ap.add_argument("--cached", nargs="+", type=float, default=[0.25, 0.5, 0.9], help="cached share of the prompt")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here; pass --device cpu for a smoke test", file=sys.stderr)
        return 2
    dtype = args.dtype or (None if is_checkpoint_name(args.model) else "bf16")
    t0 = time.perf_counter()
    model = load_model(args.model, dtype, args.device)
    where = torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else "cpu"
    print(f"{model.model_id} on {where} (torch {torch.__version__}), KV {model.kv_bytes_per_token:,} bytes/token; "
          f"loaded in {time.perf_counter() - t0:.1f} s; {args.repeats} repeats, seconds min/median")
    print(f"{'prompt':>6} {'cached':>6} | {'full s':>15} | {'cached s':>15} {'cached+copy s':>15} | "
          f"{'saved s (min)':>13} {'speed-up':>8} {'FLOP ratio':>10} | {'copy s':>7} {'KV MiB':>7} | "
          f"{'max logit diff':>14}")
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.config.vocab, max(args.lengths), dtype=np.uint32)
    for length in args.lengths:
        full_logits, full_kv = model.prefill(tokens[:length])
        for share in args.cached:
            c = min(max(1, int(length * share)), length - 1)
            past_dev = full_kv[:, :, :, :c].contiguous()
            past_host = past_dev.cpu()
            t_full, t_hit, t_copy_hit, t_copy = (timed(model, fn, args.repeats) for fn in (
                lambda: model.prefill(tokens[:length]),
                lambda: model.prefill(tokens[c:length], past_dev),
                lambda: model.prefill(tokens[c:length], past_host),
                lambda: past_host.to(model.device)))
            logits, _ = model.prefill(tokens[c:length], past_host)
            diff = float((logits[-1] - full_logits[-1]).abs().max())
            ideal = flops(model.config, length, 0) / flops(model.config, length - c, c)
            print(f"{length:>6} {c:>6} | {min(t_full):>7.4f}/{statistics.median(t_full):<7.4f} | "
                  f"{min(t_hit):>7.4f}/{statistics.median(t_hit):<7.4f} "
                  f"{min(t_copy_hit):>7.4f}/{statistics.median(t_copy_hit):<7.4f} | "
                  f"{min(t_full) - min(t_copy_hit):>13.4f} {min(t_full) / min(t_copy_hit):>8.2f} {ideal:>10.2f} | "
                  f"{min(t_copy):>7.4f} {past_host.numel() * past_host.element_size() / 2**20:>7.1f} | "
                  f"{diff:>14.2e}", flush=True)
        del full_kv
    return 0


if __name__ == "__main__":
    sys.exit(main())
