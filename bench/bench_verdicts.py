"""Does the main job give the same verdict on every sample trace run after run, beside a CPU hog?

    python bench/bench_verdicts.py                      # 5 runs of `kvcli replay sample_traces/`, each beside a hog
    python bench/bench_verdicts.py --runs 3 --no-hog    # quiet runs
    python bench/bench_verdicts.py --out runs.json      # every run's figures, for a closer look

Each run is ``kvcli replay sample_traces/ --json`` (a subprocess, its own embedded server, the defaults: the `cpu`
model calibrated and timed here) started beside a hog: one process busy-looping on one core (bounded: it stops by
itself after ``--hog-seconds``, and is killed when the replay ends). Printed: one row per trace, its verdict in
each run (the kind and the sizes it names: "16", "tie 16/64", "noise", "none"), whether they all agree, and the
figures a flip would come from: the best net benefit's range over the runs, and the largest change between runs of
the timed parts of a saving (the measured requests' saving, the critical path) relative to the trace's largest net
benefit. Nothing is asserted: the table goes in docs/measurements.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

TRACES = "sample_traces/"


def hog(seconds: float) -> subprocess.Popen:
    """A process that busy-loops on one core (the last one this process may use) for at most ``seconds``."""
    core = sorted(os.sched_getaffinity(0))[-1]
    code = (f"import os, time\nos.sched_setaffinity(0, {{{core}}})\nend = time.monotonic() + {seconds}\n"
            "while time.monotonic() < end:\n    pass\n")
    return subprocess.Popen([sys.executable, "-c", code])


def replay(args: list[str]) -> tuple[dict, float]:
    """One ``kvcli replay sample_traces/ --json ARGS``: its document and wall seconds."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "kvcli", "replay", TRACES, "--json", *args], capture_output=True,
                         text=True, env={**os.environ, "REDIS_URL": ""})
    if out.returncode != 0:
        raise SystemExit(f"replay failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout), time.perf_counter() - t0


def label(trace: dict) -> str:
    """A trace's verdict in a few characters: "16", "tie 16/64", "noise", "none"."""
    v = trace["verdict"] or {}
    if v.get("kind") == "tie":
        return "tie " + "/".join(map(str, v["tied_chunk_sizes"]))
    if v.get("kind") == "clear":
        return str(trace["recommended_chunk_size"])
    return v.get("kind") or "-"


def figures(trace: dict) -> dict:
    """Per chunk size: net benefit (the mode that decides), the measured requests' saving, the critical path."""
    return {r["chunk_size"]: {"net": r["net_benefit_seconds"], "measured": r["saved_prefill_seconds_measured"],
                              "critical": (r["overheads"] or {}).get("critical_path_seconds", 0.0)}
            for r in trace["per_chunk_size"] if r["requests"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-hog", action="store_true", help="quiet runs")
    ap.add_argument("--hog-seconds", type=float, default=300.0, help="the hog's own bound")
    ap.add_argument("--out", help="write every run's verdicts and figures here (JSON)")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more replay arguments")
    opts = ap.parse_args()
    print(f"kvcli replay {TRACES} --json {' '.join(opts.extra)}: {opts.runs} runs"
          f"{'' if opts.no_hog else ' beside a one-core hog'}; {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    runs = []
    for i in range(opts.runs):
        proc = None if opts.no_hog else hog(opts.hog_seconds)
        try:
            doc, wall = replay(opts.extra)
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
        traces = {t["trace"]: {"verdict": label(t), "figures": figures(t)} for t in doc["traces"]}
        runs.append({"wall_seconds": wall, "load": os.getloadavg()[0], "traces": traces})
        print(f"  run {i + 1}: {wall:.1f} s, load {os.getloadavg()[0]:.2f}", flush=True)
    if opts.out:
        with open(opts.out, "w") as fh:
            json.dump(runs, fh, indent=1)
    names = list(runs[0]["traces"])
    print("\n| trace | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " | same | best net, min-max | "
          "largest change of a timed part |")
    print("|---|" + "---|" * len(runs) + "---|---|---|")
    for name in names:
        verdicts = [r["traces"][name]["verdict"] for r in runs]
        per = [r["traces"][name]["figures"] for r in runs]
        best = [max((f["net"] for f in p.values()), default=0.0) for p in per]
        scale = max(max(abs(f["net"]) for f in p.values()) if p else 0.0 for p in per) or 1.0
        drift = max((abs(a[cs][part] - b[cs][part]) / scale for a in per for b in per for cs in a
                     for part in ("measured", "critical") if cs in b), default=0.0)
        print(f"| {os.path.basename(name)} | " + " | ".join(verdicts)
              + f" | {'yes' if len(set(verdicts)) == 1 else 'NO'} | {min(best):.4g}-{max(best):.4g} s "
              f"| {100 * drift:.1f}% |")
    walls = sorted(r["wall_seconds"] for r in runs)
    print(f"\nwall per run: min {walls[0]:.1f} s, median {walls[len(walls) // 2]:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
