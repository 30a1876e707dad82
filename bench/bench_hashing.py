"""Chunk hashing tokens/s vs xxh3_128 over the same bytes in one call (the floor), same run.

    python bench/bench_hashing.py
"""
from __future__ import annotations

import os
import sys

import numpy as np
import xxhash

sys.path.insert(0, os.path.dirname(__file__))
from _common import timed

from kvcli.store.hashing import chunk_prompt, namespace_root

TOKENS = 32768


def main() -> None:
    tokens = np.random.default_rng(0).integers(0, 100000, TOKENS, dtype=np.uint32)
    tokens_list = tokens.tolist()
    root = namespace_root("m", "raw")
    one = timed(lambda: xxhash.xxh3_128_digest(tokens.tobytes()), repeats=50)
    print(f"{TOKENS} tokens; min / median of repeats; tokens/s")
    print(f"xxh3_128 over all bytes in one call: {TOKENS / one[0]:,.0f} / {TOKENS / one[1]:,.0f}")
    for cs in (16, 64, 256, 1024):
        arr = timed(lambda: chunk_prompt(tokens, cs, root), repeats=20)
        lst = timed(lambda: chunk_prompt(tokens_list, cs, root), repeats=20)
        print(f"chunk size {cs:5d}: from uint32 array {TOKENS / arr[0]:,.0f} / {TOKENS / arr[1]:,.0f} "
              f"(one call is {arr[0] / one[0]:.1f}x faster); from a Python list {TOKENS / lst[0]:,.0f} "
              f"/ {TOKENS / lst[1]:,.0f}")


if __name__ == "__main__":
    main()
