"""Where the main job's memory goes before it does any work: resident memory (VmRSS, RssAnon, RssFile of
``/proc/self/status``, MiB) of one process after each step the main job takes in turn: ``import torch``, the cl100k
tokenizer loaded, the default ``cpu`` model built (fp32 weights), then one prefill of 2,048 and one of 8,192
random token ids (torch's default threads). Prints, asserts nothing; Linux only. Each step's growth is what it
adds to the main job's floor (``bench/bench_recommendation.py`` measures the whole job's peak).

    python bench/bench_main_memory.py [--model cpu] [--dtype float32]
"""
from __future__ import annotations

import argparse


def resident() -> dict[str, float]:
    """``{"VmRSS": MiB, "RssAnon": MiB, "RssFile": MiB}`` of this process."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                out[name] = int(value.split()[0]) / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cpu")
    ap.add_argument("--dtype", default=None)
    args = ap.parse_args()
    rows = [("python started", resident())]
    import numpy as np
    import torch  # noqa: F401  (its import is the step measured)

    rows.append(("import torch", resident()))
    from kvcli.model.tokenize import get_tokenizer

    get_tokenizer("cl100k_base").encode("hello world")
    rows.append(("cl100k tokenizer loaded", resident()))
    from kvcli.model.llama import build_model

    model = build_model(args.model, args.dtype, device="cpu")
    rows.append((f"model {model.model_id} built", resident()))
    rng = np.random.default_rng(0)
    for n in (2048, 8192):
        model.prefill(rng.integers(0, model.config.vocab, n).astype(np.uint32))
        rows.append((f"one {n:,}-token prefill", resident()))
    print(f"{'step':40s} {'VmRSS':>8s} {'anon':>8s} {'file':>8s} {'added':>8s}  (MiB)")
    last = 0.0
    for step, r in rows:
        print(f"{step:40s} {r['VmRSS']:8.0f} {r['RssAnon']:8.0f} {r['RssFile']:8.0f} {r['VmRSS'] - last:+8.0f}")
        last = r["VmRSS"]


if __name__ == "__main__":
    main()
