"""A hash-id trace's chunk hashes from its block keys against from its synthesized tokens, in one run.

Two measurements, each interleaved (a noisy stretch of the machine lands on every side), min / median:

* **read + hash**, in this process: every request of the trace read (``read_trace``) and its chunks hashed at
  ``--chunk-size``, by the token path (token ids synthesized, :func:`kvcli.store.hashing.chunk_hashes`) and by the
  id path (:meth:`kvcli.store.hashing.PromptChunker.hashes` of the request's block keys, no token id
  synthesized); ``read`` alone (parse and check) is the floor both share. The ratio token / id is the gain on this
  work; both must find the same number of distinct chunks.
* **the index-only replay**, each run its own process against one embedded server: ``kvcli replay TRACE
  --payload accounted --measure 0 --prefill-tps 3000 --chunk-sizes CS --json`` at ``--base REV`` (kvcli/ from
  ``git archive``) and in this checkout, the upper bound and the curve on (as users run it), and both with ``--jobs
  1`` (the trace read and hashed in the replaying process, not in a child ahead of it: there the hashing is on the
  replay's critical path); hit tokens, upper bound tokens, objects and metadata bytes must be equal.

The trace: ``--trace PATH``, else the Mooncake conversation cut (7,500 requests) extended to the full trace's
12,031 requests as docs/measurements.md does: its first 4,531 requests again, hash ids shifted past the cut's
largest and timestamps after its last (new conversations of the same shape). The load average (``uptime``) is
printed before and after: on this 2-vCPU machine other work shares the cores, so read the ratios.

    PYTHONPATH=. python bench/bench_hashid_chain.py [--trace PATH] [--chunk-size 512] [--repeats 3] [--base REV]
    PYTHONPATH=. python bench/bench_hashid_chain.py --per-size 1000 [--trace PATH] [--repeats 5]

``--per-size N`` instead times the hashing alone (the requests read once, before) of the trace's first N requests
by both paths at chunk sizes 16 to 1024.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CUT = Path("/work/shared/traces/mooncake/conversation_trace.first7500.jsonl")
FULL_REQUESTS = 12_031


def full_trace(cut: Path, out: Path, total: int = FULL_REQUESTS) -> Path:
    """``cut``'s records, then its first ``total - len(cut)`` again with hash ids shifted past the cut's largest
    and timestamps after its last (ms), written to ``out``."""
    records = [json.loads(line) for line in cut.read_text().splitlines() if line.strip()]
    shift = 1 + max(h for r in records for h in r["hash_ids"])
    last = max(r["timestamp"] for r in records)
    with out.open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for r in records[:total - len(records)]:
            f.write(json.dumps({**r, "timestamp": r["timestamp"] + last + 1,
                                "hash_ids": [h + shift for h in r["hash_ids"]]}) + "\n")
    return out


def read_and_hash(trace: str, chunk_size: int) -> dict:
    """One pass of each, by name: ``read``, ``tokens`` and ``ids``; each returns (distinct chunks, chunks)."""
    from kvcli.store.hashing import PromptChunker, chunk_hashes
    from kvcli.traces.detect import read_trace

    chunker = PromptChunker("kvcli/cpu@seed0:fp32", "cl100k_base", chunk_size)
    root = chunker.root()

    def read() -> tuple[int, int]:
        return 0, sum(r.prompt_tokens // chunk_size for r in read_trace(trace))

    def tokens() -> tuple[int, int]:
        seen, n = set(), 0
        for r in read_trace(trace):
            hashes = chunk_hashes(r.token_ids, chunk_size, root)[1]
            seen.update(hashes)
            n += len(hashes)
        return len(seen), n

    def ids() -> tuple[int, int]:
        seen, n = set(), 0
        for r in read_trace(trace):
            hashes = chunker.hashes(r.prompt, r.cache_salt)[0]
            seen.update(hashes)
            n += len(hashes)
        return len(seen), n

    return {"read": read, "tokens": tokens, "ids": ids}


def per_size(trace: str, limit: int, repeats: int) -> None:
    """Seconds to hash the first ``limit`` requests (read once, before) by each path at chunk sizes below, at and
    above Mooncake's 512-token block, dividing it or not; min of ``repeats``, interleaved."""
    import itertools

    from kvcli.store.hashing import PromptChunker
    from kvcli.traces.detect import read_trace

    requests = list(itertools.islice(read_trace(trace), limit))
    print(f"load: {load()}\nhash only, {len(requests):,} requests of {Path(trace).name}, min of {repeats}")
    print(f"{'chunk':>6s} {'tokens s':>9s} {'ids s':>7s} {'tokens / ids':>13s}")
    for cs in (16, 48, 100, 256, 512, 700, 1024):
        chunker, by_tokens, by_ids = PromptChunker("m", "t", cs), [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for r in requests:
                chunker.hashes(r.blocks.token_ids(), r.cache_salt)  # synthesized here, as the reader did
            t1 = time.perf_counter()
            for r in requests:
                chunker.hashes(r.prompt, r.cache_salt)
            by_tokens.append(t1 - t0)
            by_ids.append(time.perf_counter() - t1)
        print(f"{cs:6d} {min(by_tokens):9.3f} {min(by_ids):7.3f} {min(by_tokens) / min(by_ids):13.2f}")


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace")
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--base", default="main")
    ap.add_argument("--skip-replay", action="store_true", help="only the read + hash pass")
    ap.add_argument("--per-size", type=int, metavar="N",
                    help="instead: hash the trace's first N requests (read once) both ways at several chunk sizes")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.per_size:
        return per_size(args.trace or str(CUT), args.per_size, args.repeats)
    trace = args.trace or str(full_trace(CUT, Path(tempfile.mkdtemp(prefix="kvcli-hashid-")) / "conv12031.jsonl"))
    print(f"trace {trace}, chunk size {args.chunk_size}, {args.repeats} runs each, interleaved")
    print(f"load before: {load()}")

    passes = read_and_hash(trace, args.chunk_size)
    times: dict[str, list[float]] = {k: [] for k in passes}
    found: dict[str, set] = {k: set() for k in passes}
    for _ in range(args.repeats):
        for name, fn in passes.items():
            t0 = time.perf_counter()
            found[name].add(fn())
            times[name].append(time.perf_counter() - t0)
    assert found["tokens"] == found["ids"] and len(found["ids"]) == 1, found
    (distinct, chunks), = found["ids"]
    print(f"\nread + hash in one process ({chunks:,} chunks, {distinct:,} distinct, the same both ways)")
    print(f"{'pass':8s} {'min s':>7s} {'median s':>9s}  {'hash only: min s':>16s} {'median s':>9s}")
    floor = (min(times["read"]), statistics.median(times["read"]))
    for name in passes:
        lo, med = min(times[name]), statistics.median(times[name])
        print(f"{name:8s} {lo:7.2f} {med:9.2f}  {lo - floor[0]:16.2f} {med - floor[1]:9.2f}")
    tok = (min(times["tokens"]), statistics.median(times["tokens"]))
    idp = (min(times["ids"]), statistics.median(times["ids"]))
    print(f"token path / id path, read + hash: {tok[0] / idp[0]:.2f} / {tok[1] / idp[1]:.2f} (min / median); "
          f"beyond the read: {(tok[0] - floor[0]) / (idp[0] - floor[0]):.2f} / "
          f"{(tok[1] - floor[1]) / (idp[1] - floor[1]):.2f}")
    if not args.skip_replay:
        replay_walls(trace, args)
    print(f"load after: {load()}")


def replay_walls(trace: str, args) -> None:
    """The index-only replay before (``--base``) and after, interleaved, each its own process."""
    from kvcli.store.server import embedded_server

    base = tempfile.mkdtemp(prefix="kvcli-base-")
    subprocess.run(f"git -C {ROOT} archive {args.base} kvcli | tar -x -C {base}", shell=True, check=True)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], capture_output=True,
                         text=True).stdout.strip()
    replay = [sys.executable, "-m", "kvcli", "replay", trace, "--payload", "accounted", "--measure", "0",
              "--prefill-tps", "3000", "--chunk-sizes", str(args.chunk_size), "--json"]
    with embedded_server() as url:
        before = {**os.environ, "PYTHONPATH": base, "REDIS_URL": url}
        after = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": url}
        variants = {f"before ({rev})": (replay, before), "after": (replay, after),
                    "before --jobs 1": (replay + ["--jobs", "1"], before),
                    "after --jobs 1": (replay + ["--jobs", "1"], after)}
        walls: dict[str, list[float]] = {k: [] for k in variants}
        figures: dict[str, set] = {k: set() for k in variants}
        for _ in range(args.repeats):
            for name, (cmd, env) in variants.items():
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                walls[name].append(time.perf_counter() - t0)
                if proc.returncode:
                    raise SystemExit(f"{name} failed: {proc.stderr[-2000:]}")
                row = json.loads(proc.stdout)["traces"][0]["per_chunk_size"][0]
                figures[name].add((row["hit_tokens"], row["upper_bound_tokens"], row["objects_created"],
                                   row["metadata_bytes_written"]))
    print("\nindex-only replay, wall seconds of the whole process (start-up, imports, calibration, cleanup)")
    print(f"{'variant':18s} {'min s':>7s} {'median s':>9s} {'/ before':>11s}  (hit, upper bound, objects, "
          f"metadata bytes)")
    ref = {k: (min(v), statistics.median(v)) for k, v in walls.items()}
    names = list(ref)
    for i, name in enumerate(names):  # each after over the before of its own options
        lo, med = ref[name]
        was = ref[names[i - 1]] if name.startswith("after") else (lo, med)
        print(f"{name:18s} {lo:7.2f} {med:9.2f} {lo / was[0]:5.2f}/{med / was[1]:4.2f}  {sorted(figures[name])}")
    values = list(figures.values())
    assert all(v == values[0] and len(v) == 1 for v in values), figures


if __name__ == "__main__":
    main()
