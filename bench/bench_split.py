"""One chunk size on every core: ``kvcli replay --jobs N`` (the trace's requests split by prefix root,
kvcli.replay.split) against ``--jobs 1`` (one process, no child reading ahead), interleaved, with the same figures.

Each run is its own ``kvcli replay TRACE --payload accounted --measure 0 --prefill-tps 5000 --chunk-sizes CS
--jobs N --json`` process against its own embedded server, as users run it (imports, the server's start, transfer
calibration and cleanup included). The sides run in turn, round after round (``--rounds``), so a slow spell of this
shared machine lands on every side; per side the table gives wall seconds min and median, the ratio to ``--jobs 1``
of the same round (min and median over rounds), and the CPU seconds (user + system) of the run's whole process tree
(kvcli, its workers, its read-ahead child and its embedded server: ``RUSAGE_CHILDREN`` of this script), min and
median. Hit tokens, upper bound tokens, objects and metadata bytes must be equal on every side and round, and each
``--jobs N`` run's note says how the split went (the largest part's share of the work bounds the speedup).
The load average (``uptime``) is printed before and after.

The trace: ``--trace PATH``, else the Mooncake conversation cut (../shared/traces/mooncake/
conversation_trace.first7500.jsonl) extended to the full trace's 12,031 requests as bench/bench_hashid_chain.py
does (its first 4,531 requests again, hash ids shifted past the cut's largest, timestamps after its last).

    PYTHONPATH=. python bench/bench_split.py [--trace PATH] [--chunk-size 512] [--jobs 1,2] [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hashid_chain import CUT, full_trace

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("hit_tokens", "upper_bound_tokens", "objects_created", "metadata_bytes_written", "hit_tokens_unlimited")


def run(trace: str, chunk_size: int, jobs: int, extra: list[str]) -> dict:
    """One replay in its own process: wall seconds, CPU seconds of its process tree, its figures and notes."""
    cmd = [sys.executable, "-m", "kvcli", "replay", trace, "--payload", "accounted", "--measure", "0",
           "--prefill-tps", "5000", "--chunk-sizes", str(chunk_size), "--jobs", str(jobs), "--json", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout)["traces"][0]
    row = result["per_chunk_size"][0]
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "figures": {k: row[k] for k in FIGURES},
            "notes": [n for n in result["notes"] if "parts at once" in n]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path)
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--jobs", default="1,2", help="comma-separated --jobs values; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--extra", default="", help="more replay options, space-separated (e.g. '--no-upper-bound')")
    args = ap.parse_args()
    sides = [int(j) for j in args.jobs.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        trace = str(args.trace or full_trace(CUT, Path(tmp) / "conv12031.jsonl"))
        print(f"trace {trace}, chunk size {args.chunk_size}, --jobs {args.jobs}, {args.rounds} rounds")
        print(f"uptime before: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
        runs: dict[int, list[dict]] = {j: [] for j in sides}
        for _ in range(args.rounds):
            for j in sides:
                runs[j].append(run(trace, args.chunk_size, j, args.extra.split()))
        print(f"uptime after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    base = runs[sides[0]]
    reference = base[0]["figures"]
    assert all(r["figures"] == reference for j in sides for r in runs[j]), "figures differ between runs"
    print(f"figures (every run): {reference}")
    print(f"{'--jobs':>7} {'wall min':>9} {'median':>8} {'ratio min':>10} {'median':>8} {'CPU min':>8} {'median':>8}")
    for j in sides:
        walls = [r["wall"] for r in runs[j]]
        ratios = [r["wall"] / b["wall"] for r, b in zip(runs[j], base)]
        cpus = [r["cpu"] for r in runs[j]]
        print(f"{j:>7} {min(walls):>9.2f} {statistics.median(walls):>8.2f} {min(ratios):>10.2f} "
              f"{statistics.median(ratios):>8.2f} {min(cpus):>8.2f} {statistics.median(cpus):>8.2f}")
    for j in sides:
        for note in sorted({n for r in runs[j] for n in r["notes"]}):
            print(f"--jobs {j}: {note}")


if __name__ == "__main__":
    main()
