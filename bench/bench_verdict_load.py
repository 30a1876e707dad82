"""Do replay verdicts move with this machine's load? The same replay, quiet and beside a CPU hog, interleaved.

    python bench/bench_verdict_load.py                                   # local measured mode, the default traces
    python bench/bench_verdict_load.py --mode hardware                   # priced on --hardware h100-sxm
    python bench/bench_verdict_load.py --mode profile --profile P.json   # priced with a measured profile
    python bench/bench_verdict_load.py --mode local --repeats 2 --traces sample_traces/glaive_toolcall_head30.json

Each round runs every trace once quiet and once with a hog (one busy-looping process per core, started before the
replay and killed after it), alternating which comes first, so a slow spell of the machine falls on both. Each
run is ``kvcli replay TRACE --json`` as a subprocess (start-up included) on its own embedded server. Printed per
run: the verdict (its kind, the sizes it names) and every chunk size's net benefit; then per trace and mode: in
how many rounds the hog run's verdict differed from the quiet one's, and the largest relative change of a chunk
size's net benefit between the two, relative to the trace's largest net benefit (``|hog - quiet| / max |quiet|``).
Nothing is asserted: the figures go in
docs/measurements.md.

Modes: ``local`` (calibrated here, the default model, --measure 2), ``hardware`` (``--model llama-3-8b
--hardware h100-sxm --payload accounted``: nothing timed), ``profile`` (``--prefill-profile FILE --payload
accounted``; ``--model`` must be the profile's). ``--extra`` appends arguments to every replay.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time

TRACES = ("sample_traces/chat_shared_system.jsonl", "sample_traces/glaive_toolcall_head30.json",
          "sample_traces/sharegpt_multiturn.json", "sample_traces/tokens_small.jsonl")
MODES = {
    "local": [],
    "hardware": ["--model", "llama-3-8b", "--hardware", "h100-sxm", "--payload", "accounted"],
    "profile": ["--payload", "accounted"],
}


def _spin() -> None:
    while True:
        pass


class Hog:
    """One busy-looping process per core for the block."""

    def __enter__(self):
        self.procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 2)]
        for p in self.procs:
            p.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.join()
        return False


def replay(trace: str, args: list[str]) -> dict:
    """One ``kvcli replay TRACE --json ARGS`` (a subprocess): its verdict and net benefits per chunk size."""
    out = subprocess.run([sys.executable, "-m", "kvcli", "replay", trace, "--json", *args], capture_output=True,
                         text=True, env={**os.environ, "REDIS_URL": ""})
    if out.returncode != 0:
        raise SystemExit(f"replay failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    (t,) = json.loads(out.stdout)["traces"]
    verdict = t["verdict"] or {}
    nets = {r["chunk_size"]: r["net_benefit_seconds"] for r in t["per_chunk_size"] if r["requests"]}
    return {"kind": verdict.get("kind"), "tied": tuple(verdict.get("tied_chunk_sizes", ())),
            "chunk_size": t["recommended_chunk_size"], "nets": nets}


def label(run: dict) -> str:
    names = "/".join(map(str, run["tied"])) if run["kind"] == "tie" else run["chunk_size"]
    return f"{run['kind']} {names}".strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=sorted(MODES), default="local")
    ap.add_argument("--traces", nargs="+", default=list(TRACES))
    ap.add_argument("--repeats", type=int, default=1, help="rounds (each: quiet and hog, alternating order)")
    ap.add_argument("--profile", help="the profile for --mode profile")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more replay arguments")
    opts = ap.parse_args()
    args = MODES[opts.mode] + (["--prefill-profile", opts.profile] if opts.mode == "profile" else []) + opts.extra
    if opts.mode == "profile" and not opts.profile:
        ap.error("--mode profile needs --profile FILE")
    print(f"mode {opts.mode}: kvcli replay TRACE --json {' '.join(args)}; {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    summary = []
    for trace in opts.traces:
        flips, worst = 0, 0.0
        for round_ in range(opts.repeats):
            runs = {}
            for hogged in ((False, True) if round_ % 2 == 0 else (True, False)):
                if hogged:
                    with Hog():
                        runs[hogged] = replay(trace, args)
                else:
                    runs[hogged] = replay(trace, args)
            quiet, hog = runs[False], runs[True]
            flips += label(quiet) != label(hog)
            scale = max((abs(q) for q in quiet["nets"].values()), default=0.0)
            if scale:  # relative to the largest net benefit: a size netting ~0 would make any change look huge
                worst = max(worst, max(abs(hog["nets"].get(cs, q) - q) for cs, q in quiet["nets"].items()) / scale)
            for name, run in (("quiet", quiet), ("hog", hog)):
                nets = ", ".join(f"{cs}: {v:.4g} s" for cs, v in run["nets"].items())
                print(f"  {os.path.basename(trace)} round {round_ + 1} {name:5s}: {label(run):22s} net {nets}",
                      flush=True)
        summary.append((trace, flips, worst))
    print(f"\nmode {opts.mode}: verdict changed beside the hog / largest change of a net benefit, relative to the "
          f"largest one")
    for trace, flips, worst in summary:
        print(f"  {os.path.basename(trace):45s} {flips} of {opts.repeats}   {100 * worst:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
