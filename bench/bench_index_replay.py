"""Index-only replay against the shared reference sketch: wall, server CPU and tree memory, interleaved.

The reference is ``../shared/tools/pipelined_sketch.py`` (read, parse, synthesize, chain-hash, one EVALSHA per
request that finds the hit run and SET NX's the rest, 256 requests per round trip; its keys left on the server),
which every helper runs the same way. kvcli runs as users run it: ``kvcli replay TRACE --payload accounted --measure
0 --prefill-tps 5000 --chunk-sizes CS [--limit L] --json --redis-url URL`` (the upper bound and the curve on, its
cleanup of the keys it wrote included), and as the default runs, on its embedded server (no ``--redis-url``: its
server started, and emptied whole, inside the run; server CPU from the replay's ``server_cpu_seconds``), with
``--base REV`` also kvcli at REV (``git archive`` of its kvcli/).
Each is its own process (start-up and imports count) against one server this script starts (Valkey, the embedded
binary, on a loopback port; ``--url`` a scratch server of yours), emptied between runs outside the timings.

Per case (``--cases``: ``512`` the whole trace at chunk 512, ``16:2000`` its first 2,000 requests at chunk 16) and
round, every variant runs once, in turn (interleaved: a noisy stretch of a shared machine lands on each). Per run:
wall seconds, the server's CPU seconds (``INFO cpu`` before and after: its whole process) and the hit tokens. The
table gives min / median of each, and min / median over rounds of each run's ratio to the sketch's run of the same
round.

``--pss``: instead, tree PSS (MiB: the kvcli process and its children, ``/proc/*/smaps_rollup`` polled every
50 ms, the peak) at chunk 512 with the defaults, with ``--no-upper-bound --no-curve``, the sketch's and (``--base``)
kvcli at REV with the defaults, on the trace extended to ``--requests`` (default 48,124: 4x the full conversation
trace).

The trace: ``--trace PATH``, else the Mooncake conversation cut in ``../shared/traces/mooncake/`` (7,500 of the
12,031 requests) extended to 12,031 (``--pss``: ``--requests``) by :func:`bench._common.extended_trace`.
``uptime`` is printed before and after.

    PYTHONPATH=. python bench/bench_index_replay.py [--trace PATH] [--rounds 5] [--cases 512 16:2000] [--base REV]
        [--extra "--jobs 1"] [--dir NAME=FOLDER]
    PYTHONPATH=. python bench/bench_index_replay.py --pss [--requests 48124] [--rounds 2]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import extended_trace, shared_file, sketch_command, tree_pss_mib, uptime  # noqa: E402

FULL_REQUESTS = 12_031  # the Mooncake conversation trace's length
CUT = "traces/mooncake/conversation_trace.first7500.jsonl"


def server_cpu(client) -> float:
    """The server process's CPU seconds so far (user + system)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def run_one(cmd: list[str], env: dict, client, pss: bool = False) -> dict:
    """One run: wall seconds, server CPU seconds, hit tokens, keys it left, and (``pss``) its peak tree PSS (MiB)."""
    cpu0, t0 = server_cpu(client), time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tempfile.gettempdir())
    peak = [0.0]
    watcher = None
    if pss:
        def watch() -> None:
            while proc.poll() is None:
                peak[0] = max(peak[0], tree_pss_mib(proc.pid))
                time.sleep(0.05)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
    out, err = proc.communicate()
    wall, cpu = time.perf_counter() - t0, server_cpu(client) - cpu0
    if watcher is not None:
        watcher.join()
    if proc.returncode:
        raise SystemExit(f"{shlex.join(cmd)} failed: {err.decode()[-2000:]}")
    text = out.decode().strip()
    try:
        doc = json.loads(text)  # kvcli's --json document
    except json.JSONDecodeError:
        doc = json.loads(text.splitlines()[-1])  # the sketch's one line
    hits = doc["traces"][0]["per_chunk_size"][0]["hit_tokens"] if "traces" in doc else doc["hit_tokens"]
    own = doc.get("context", {}).get("server_cpu_seconds")
    if own is not None:  # kvcli on its embedded server: that server's whole CPU (the shared server saw nothing)
        cpu = own
    left = int(client.dbsize())
    client.execute_command("FLUSHDB", "SYNC")  # the sketch's keys, freed now (not during the next run)
    return {"wall": wall, "cpu": cpu, "hits": hits, "left": left, "pss": peak[0]}


def variants(args, trace: str, chunk: int, limit: int | None, url: str, port: int) -> dict[str, tuple]:
    """``{name: (command, env)}``: the sketch, kvcli here, ``--extra`` variants, and kvcli at ``--base``."""
    replay = [sys.executable, "-m", "kvcli", "replay", trace, "--payload", "accounted", "--measure", "0",
              "--prefill-tps", "5000", "--chunk-sizes", str(chunk), "--json", "--redis-url", url]
    replay += ["--limit", str(limit)] if limit else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    out = {"sketch": (sketch_command(trace, chunk, port, limit), env), "kvcli": (replay, env),
           "kvcli (embedded)": ([a for a in replay if a not in ("--redis-url", url)], env)}
    for extra in args.extra:
        out[f"kvcli {extra}"] = (replay + shlex.split(extra), env)
    if args.base:
        out[f"kvcli@{args.base}"] = (replay, {**env, "PYTHONPATH": args.base_dir})
    for spec in args.dir:
        name, _, folder = spec.partition("=")
        out[f"{name} (embedded)"] = (out["kvcli (embedded)"][0], {**env, "PYTHONPATH": folder})
    return out


def timings(args, trace: str, client, url: str, port: int) -> None:
    """The interleaved rounds of every case, and their table."""
    for case in args.cases:
        chunk, _, limit_text = case.partition(":")
        limit = int(limit_text) if limit_text else None
        runs = variants(args, trace, int(chunk), limit, url, port)
        got: dict[str, list[dict]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, (cmd, env) in runs.items():
                got[name].append(run_one(cmd, env, client))
        what = f"first {limit:,} requests" if limit else "all requests"
        print(f"\n{Path(trace).name}, {what}, chunk size {chunk}, {args.rounds} interleaved rounds; load after: "
              f"{uptime()}")
        print(f"{'variant':26s} {'wall s min/med':>15s} {'CPU s min/med':>15s} {'wall / sketch':>14s} "
              f"{'CPU / sketch':>13s}  hit tokens  keys left")
        sketch = got["sketch"]
        for name, rows in got.items():
            wall = [r["wall"] for r in rows]
            cpu = [r["cpu"] for r in rows]
            rw = [r["wall"] / s["wall"] for r, s in zip(rows, sketch)]
            rc = [r["cpu"] / s["cpu"] for r, s in zip(rows, sketch)]
            print(f"{name:26s} {min(wall):7.2f} {statistics.median(wall):7.2f} {min(cpu):7.2f} "
                  f"{statistics.median(cpu):7.2f} {min(rw):6.2f} {statistics.median(rw):6.2f}x "
                  f"{min(rc):5.2f} {statistics.median(rc):5.2f}x  {sorted({r['hits'] for r in rows})}  "
                  f"{sorted({r['left'] for r in rows if not name.startswith('sketch')})}")


def memory(args, trace: str, client, url: str, port: int) -> None:
    """Peak tree PSS of kvcli (defaults; without upper bound and curve) and of the sketch, at chunk 512."""
    runs = variants(args, trace, 512, None, url, port)
    kvcli_cmd, env = runs["kvcli"]
    runs = {"kvcli": runs["kvcli"], "kvcli --no-upper-bound --no-curve": (
        kvcli_cmd + ["--no-upper-bound", "--no-curve"], env), "sketch": runs["sketch"],
            **{name: run for name, run in runs.items() if name.startswith("kvcli@")}}
    got: dict[str, list[dict]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (cmd, variant_env) in runs.items():
            got[name].append(run_one(cmd, variant_env, client, pss=True))
    with open(trace) as f:
        requests = sum(1 for line in f if line.strip())
    print(f"\n{Path(trace).name}, {requests:,} requests, chunk size 512: peak tree PSS (the process and its "
          f"children), {args.rounds} rounds; load after: {uptime()}")
    for name, rows in got.items():
        print(f"{name:36s} PSS MiB {min(r['pss'] for r in rows):6.0f} - {max(r['pss'] for r in rows):4.0f}   "
              f"wall s {min(r['wall'] for r in rows):6.2f}  hit tokens {sorted({r['hits'] for r in rows})}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", help="a Mooncake-format trace (default: the cut extended to 12,031 requests)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", nargs="+", default=["512", "16:2000"], help="CHUNK or CHUNK:LIMIT")
    ap.add_argument("--base", help="also run kvcli at this git revision")
    ap.add_argument("--extra", action="append", default=[], help="a kvcli variant with these extra options")
    ap.add_argument("--dir", action="append", default=[], metavar="NAME=FOLDER",
                    help="also the kvcli package in FOLDER (a changed copy), on its embedded server")
    ap.add_argument("--url", help="a scratch server of yours on a loopback port (its database is flushed)")
    ap.add_argument("--pss", action="store_true", help="tree PSS at chunk 512 instead of the timings")
    ap.add_argument("--requests", type=int, default=4 * FULL_REQUESTS, help="with --pss: the trace's length")
    args = ap.parse_args()
    print(f"load before: {uptime()}")
    folder = Path(tempfile.mkdtemp(prefix="kvcli-bench-"))
    trace = args.trace or str(extended_trace(shared_file(CUT), folder / "conversation.jsonl",
                                             args.requests if args.pss else FULL_REQUESTS))
    if args.base:
        args.base_dir = str(folder / "base")
        os.mkdir(args.base_dir)
        subprocess.run(f"git -C {ROOT} archive {args.base} kvcli | tar -x -C {args.base_dir}", shell=True,
                       check=True)
    import redis

    from kvcli.store.server import embedded_server

    with (contextlib.nullcontext(args.url) if args.url else embedded_server(tcp=True)) as url:
        client = redis.Redis.from_url(url)
        client.execute_command("FLUSHDB", "SYNC")
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        (memory if args.pss else timings)(args, trace, client, url, port)


if __name__ == "__main__":
    main()
