"""Shared helpers for bench/ scripts: repeat a timing, report min and median."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(fn, repeats: int = 5) -> tuple[float, float]:
    """Run ``fn`` ``repeats`` times; return (min, median) wall seconds. The machine is noisy: report both."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def interleaved(fns, repeats: int = 5, warmup: bool = True) -> list[list[float]]:
    """Seconds of ``repeats`` calls of each function, after one warm-up call each. Calls are interleaved (f1, f2, ...,
    f1, f2, ...), so a slow spell of the machine lands on every side of a comparison instead of on one."""
    if warmup:
        for fn in fns:
            fn()
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, times in zip(fns, out):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return out


def shared_file(relative: str) -> Path:
    """A file of the helpers' shared folder (``../shared/<relative>`` beside this checkout's folder, else
    ``/work/shared/<relative>``).

    Raises:
        SystemExit: it is in neither place."""
    root = Path(__file__).resolve().parents[1]
    for base in (root.parent / "shared", Path("/work/shared")):
        if (base / relative).exists():
            return base / relative
    raise SystemExit(f"../shared/{relative} not found beside {root}")


def sketch_command(trace: str, chunk: int, port: int, limit: int | None = None) -> list[str]:
    """The shared reference, ``../shared/tools/pipelined_sketch.py TRACE CHUNK PORT [--limit N]``: read, parse,
    synthesize, chain-hash, one EVALSHA per request (the hit run, then SET NX of the rest), 256 requests per round
    trip, its keys left on the server (its docstring). Prints one JSON line with ``hit_tokens``."""
    cmd = [sys.executable, str(shared_file("tools/pipelined_sketch.py")), trace, str(chunk), str(port)]
    return cmd + (["--limit", str(limit)] if limit else [])


def extended_trace(cut: Path, out: Path, total: int) -> Path:
    """A Mooncake-format trace of ``total`` requests written to ``out``: ``cut``'s records, then ``cut`` again (as
    often as needed, the last time its first records only), each repeat's hash ids shifted past every id before it
    and its timestamps after the last (ms): new conversations of the same shape, so distinct chunks grow with
    ``total``. ``total = 12,031`` from the 7,500-request cut is the full conversation trace's length."""
    records = [json.loads(line) for line in cut.read_text().splitlines() if line.strip()]
    shift = 1 + max(h for r in records for h in r["hash_ids"])
    span = 1 + max(r["timestamp"] for r in records)
    with out.open("w") as f:
        for i in range(total):
            r, k = records[i % len(records)], i // len(records)
            f.write(json.dumps({**r, "timestamp": r["timestamp"] + k * span,
                                "hash_ids": [h + k * shift for h in r["hash_ids"]]}) + "\n")
    return out


def tree_pss_mib(pid: int) -> float:
    """Proportional set size (MiB) of process ``pid`` and every descendant it has now (``/proc/*/smaps_rollup``;
    shared pages counted once over the tree); 0 for a process that is gone. Linux only."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, StopIteration):
            continue
    return total / 1024


def uptime() -> str:
    """``uptime``'s line: the machine's load, for a report beside its timings."""
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
