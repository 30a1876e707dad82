"""Index-only replay (``--payload accounted --measure 0``): the batch script against two references, in one run.

Every variant runs as its own process (start-up and imports count, as for a user) against the same server that
this script starts, on the same Mooncake trace at one chunk size, and reports the hit tokens it found:

* ``before``: kvcli at ``--base REV`` (default a0f3545: main before the pipelined index-only replay, extracted with
  ``git archive``), ``python -m kvcli replay``;
* ``after``: this checkout, the same command (``--pipeline`` default 256); ``after --pipeline 1``: one request at a
  time; ``after --no-curve``: without the capacity/TTL curve (which the sketch does not compute); ``after --jobs
  1``: without the child that reads and hashes the trace ahead (kvcli/replay/prefetch.py);
* ``sketch``: read, synthesize tokens, hash, then one server-side Lua script per request (lookup + store of the
  missing chunks) with 256 requests per pipelined round trip (no LRU, no accounting, no cleanup).

Wall seconds (min / median of ``--repeats``), peak RSS (MiB, of that process and of its largest child), and each
variant's time over ``sketch``'s and ``before``'s in this run, the hit tokens each found. Every kvcli variant runs
as users run it, the token-granular upper bound on (its tree in the child that reads ahead, whose peak RSS the
table gives), except ``after --no-upper-bound``.

Fixed costs (start-up and imports, the transfer calibration, the cleanup's scan of the server) weigh on a trace
of a few seconds as they would not on one of hours. So ``after``, ``after --no-curve`` and ``sketch`` also run on
the trace's first half (``--limit``; ``... half``), and the last table gives the cost per 1,000 requests of the
second half, ``(t(all) - t(half)) / (requests - half)``, from the min and from the median of each, over
``sketch``'s: what a trace many times longer would cost per request.

    PYTHONPATH=. python bench/bench_index_replay.py [--trace PATH] [--chunk-size 512] [--repeats 3] [--base REV]
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent.parent / "shared/traces/mooncake/conversation_trace.first7500.jsonl"
if not DEFAULT.exists():
    DEFAULT = Path("/work/shared/traces/mooncake/conversation_trace.first7500.jsonl")

SKETCH_LUA = """
local n, hit = #KEYS, 0
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if not v or string.sub(v, 1, 8) ~= ARGV[i] then break end
  hit = i
end
for i = hit + 1, n do
  if redis.call('EXISTS', KEYS[i]) == 0 then redis.call('SET', KEYS[i], ARGV[n + i]) end
end
return hit
"""


def reference(kind: str, trace: str, chunk: int, url: str, limit: int | None = None) -> None:
    """The floor or the sketch, run in this (child) process; prints hit tokens and the namespace it wrote."""
    import redis

    from kvcli.store.hashing import chunk_prompt, namespace_root
    from kvcli.traces.detect import read_trace

    client = redis.Redis.from_url(url)
    ns = f"bench-{kind}-{os.getpid()}"
    root = namespace_root("kvcli/cpu@seed0:bf16", "cl100k_base")
    meta_tail = b'{"tokens":512,"dtype":"BF16","stored":"accounted"}'
    hits = 0
    if True:
        sha = client.script_load(SKETCH_LUA)
        pipe, queued = client.pipeline(transaction=False), []
        for req in itertools.islice(read_trace(trace), limit):
            p = chunk_prompt(req.token_ids, chunk, root)
            if not p.hashes:
                continue
            keys = [f"kvcli:v1:{ns}:{chunk}:m:{h}" for h in p.hexes]
            pipe.evalsha(sha, len(keys), *keys, *p.digests, *[d + b"\0" * 8 + meta_tail for d in p.digests])
            queued.append(1)
            if len(queued) == 256:
                hits += sum(pipe.execute()) * chunk
                queued = []
        if queued:
            hits += sum(pipe.execute()) * chunk
    print(json.dumps({"hit_tokens": hits, "namespace": ns}))


def run(cmd: list[str], env: dict) -> tuple[float, float, dict]:
    """Wall seconds, peak RSS (MiB) of the child, and its stdout's last JSON line."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate()
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {err.decode()[-2000:]}")
    text = out.decode().strip()
    try:
        doc = json.loads(text)  # kvcli's --json document
    except json.JSONDecodeError:
        doc = json.loads(text.splitlines()[-1])  # a reference's one line
    return seconds, _peak_rss(err), doc


def _peak_rss(stderr: bytes) -> tuple[float, float]:
    """Peak RSS (MiB) of the process and of its largest child (the trace read ahead: kvcli/replay/prefetch.py;
    a forked child's RSS counts the pages it still shares with its parent too)."""
    for line in stderr.decode().splitlines():
        if line.startswith("PEAK_RSS_KB "):
            return int(line.split()[1]) / 1024, int(line.split()[2]) / 1024
    return float("nan"), float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(DEFAULT))
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--base", default="a0f3545")
    ap.add_argument("--reference", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reference:
        return reference(args.reference[0], args.trace, args.chunk_size, args.reference[1], args.limit)

    sys.path.insert(0, str(ROOT))
    import redis

    from kvcli.store.server import embedded_server

    base = tempfile.mkdtemp(prefix="kvcli-base-")
    subprocess.run(f"git -C {ROOT} archive {args.base} kvcli | tar -x -C {base}", shell=True, check=True)
    wrap = os.path.join(tempfile.mkdtemp(prefix="kvcli-wrap-"), "peak_rss.py")  # runs a module, reports its RSS
    Path(wrap).write_text(
        "import resource, runpy, sys\nsys.argv = sys.argv[1:]\ncode = 0\ntry:\n"
        "    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
        "except SystemExit as exc:\n    code = exc.code or 0\n"
        "sys.stderr.write('PEAK_RSS_KB %d %d\\n' % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
        "sys.exit(code)\n")
    replay = ["replay", args.trace, "--payload", "accounted", "--measure", "0", "--prefill-tps", "3000",
              "--chunk-sizes", str(args.chunk_size), "--json"]
    with (gzip.open if args.trace.endswith(".gz") else open)(args.trace, "rb") as f:
        requests = sum(1 for line in f if line.strip())
    half = requests // 2
    with embedded_server() as url:
        client = redis.Redis.from_url(url)
        env_base = {**os.environ, "PYTHONPATH": base, "REDIS_URL": url}
        env_after = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": url}
        variants = {
            "before": ([sys.executable, wrap, "kvcli", *replay], env_base),
            "after": ([sys.executable, wrap, "kvcli", *replay], env_after),
            "after --pipeline 1": ([sys.executable, wrap, "kvcli", *replay, "--pipeline", "1"], env_after),
            "after --no-curve": ([sys.executable, wrap, "kvcli", *replay, "--no-curve"], env_after),
            "after --no-upper-bound": ([sys.executable, wrap, "kvcli", *replay, "--no-upper-bound"], env_after),
            "after --jobs 1": ([sys.executable, wrap, "kvcli", *replay, "--jobs", "1"], env_after),
            "sketch": ([sys.executable, wrap, "bench.bench_index_replay", "--trace", args.trace,
                        "--chunk-size", str(args.chunk_size), "--reference", "sketch", url],
                       {**env_after, "PYTHONPATH": str(ROOT)}),
            "after half": ([sys.executable, wrap, "kvcli", *replay, "--limit", str(half)], env_after),
            "after --no-curve half": ([sys.executable, wrap, "kvcli", *replay, "--no-curve", "--limit", str(half)],
                                      env_after),
            "sketch half": ([sys.executable, wrap, "bench.bench_index_replay", "--trace", args.trace,
                             "--chunk-size", str(args.chunk_size), "--reference", "sketch", url, "--limit",
                             str(half)], {**env_after, "PYTHONPATH": str(ROOT)}),
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        rss: dict[str, list[float]] = {k: [] for k in variants}
        hits: dict[str, set] = {k: set() for k in variants}
        for _ in range(args.repeats):
            for name, (cmd, env) in variants.items():  # interleaved: a noisy stretch hits every variant
                seconds, peak, out = run(cmd, env)
                times[name].append(seconds)
                rss[name].append(peak)
                if "traces" in out:
                    hits[name].add(out["traces"][0]["per_chunk_size"][0]["hit_tokens"])
                else:
                    hits[name].add(out["hit_tokens"])
                    for key in client.scan_iter(f"kvcli:v1:{out['namespace']}:*", count=5000):
                        client.unlink(key)
    ref = {k: (min(v), statistics.median(v)) for k, v in times.items()}
    print(f"index-only replay of {Path(args.trace).name}, chunk size {args.chunk_size}, {args.repeats} runs each, "
          f"interleaved; wall seconds of the whole process (start-up and imports included)")
    print(f"{'variant':22s} {'min s':>7s} {'median s':>9s} {'RSS MiB (child)':>15s} {'/ sketch':>9s} {'/ before':>9s}"
          f"  hit tokens")
    for name in variants:
        lo, med = ref[name]
        own, child = max(r[0] for r in rss[name]), max(r[1] for r in rss[name])
        print(f"{name:22s} {lo:7.2f} {med:9.2f} {own:7.0f} ({child:5.0f}) "
              f"{lo / ref['sketch'][0]:5.2f}/{med / ref['sketch'][1]:4.2f} "
              f"{lo / ref['before'][0]:5.2f}/{med / ref['before'][1]:4.2f}  {sorted(hits[name])}")
    rest = requests - half
    per = {k: tuple((ref[k][i] - ref[f"{k} half"][i]) / rest * 1000 for i in (0, 1))
           for k in ("after", "after --no-curve", "sketch")}
    print(f"\nper 1,000 requests of the second half ({half:,} -> {requests:,} requests; fixed costs cancel)")
    print(f"{'variant':22s} {'from min s':>11s} {'from median s':>14s} {'/ sketch':>9s}")
    for name, (lo, med) in per.items():
        print(f"{name:22s} {lo:11.3f} {med:14.3f} {lo / per['sketch'][0]:5.2f}/{med / per['sketch'][1]:4.2f}")


if __name__ == "__main__":
    main()
