"""Throughput of the trace readers and the tokenizer (CPU only; prints a table, asserts nothing).

Usage: ``python bench/bench_traces.py [TRACE ...]`` (default: every file in sample_traces/ and, when present, the
7,500-line Mooncake trace under /work/shared/traces/).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from kvcli.model.tokenize import get_tokenizer
from kvcli.traces.detect import detect_format, read_trace

ROOT = Path(__file__).resolve().parent.parent
MOONCAKE_7500 = Path("/work/shared/traces/mooncake/conversation_trace.first7500.jsonl")


def bench_tokenizer() -> None:
    t0 = time.perf_counter()
    tok = get_tokenizer("cl100k_base")
    load_s = time.perf_counter() - t0
    text = (ROOT / "sample_traces" / "no_reuse.jsonl").read_text() * 4
    while len(tok.encode(text)) > 4096:
        text = text[: int(len(text) * 0.9)]
    n = len(tok.encode(text))
    reps = 50
    t0 = time.perf_counter()
    for _ in range(reps):
        tok.encode(text)
    per_ms = (time.perf_counter() - t0) / reps * 1e3
    print(f"tokenizer load {load_s * 1e3:.0f} ms; encode {n} tokens: {per_ms:.2f} ms")


def bench_file(path: Path) -> None:
    t0 = time.perf_counter()
    n_req = n_tok = 0
    for request in read_trace(path):
        n_req += 1
        n_tok += len(request.token_ids)
    dt = time.perf_counter() - t0
    print(f"{path.name:50s} {detect_format(path):9s} {n_req:6d} req {n_tok:11,d} tok {dt:7.3f} s "
          f"{n_tok / dt / 1e6:7.1f} Mtok/s")


def main(argv: list[str]) -> None:
    bench_tokenizer()
    paths = [Path(a) for a in argv] or sorted(
        p for p in (ROOT / "sample_traces").iterdir() if p.suffix not in (".md", ".py"))
    if not argv and MOONCAKE_7500.exists():
        paths.append(MOONCAKE_7500)
    for path in paths:
        bench_file(path)


if __name__ == "__main__":
    main(sys.argv[1:])
