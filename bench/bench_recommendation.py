"""Is the recommendation stable, and what does the main job cost? ``kvcli replay sample_traces/`` repeated.

Runs the README's main job ``--repeats`` times (separate processes, defaults, fixed seed) and prints, per trace, the
verdict of every run (the recommended chunk size, or the sizes that tie, or none), whether all runs agree, and the
spread of the best size's saved prefill (min / max over runs) and of the relative differences between sizes (the
drift that ``TIE_TOLERANCE`` in kvcli/replay/savings.py absorbs). Time: wall and CPU (user + sys of the process and
its children: the embedded server) per run, min and median; the baseline, measured in the same run, is the same
traces replayed index-only (``--measure 0 --prefill-tps 1000 --payload accounted``: no model, no calibration).

    python bench/bench_recommendation.py                # 3 repeats of the main job
    python bench/bench_recommendation.py --repeats 2 --traces sample_traces/chat_shared_system.jsonl
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str]) -> tuple[dict, float, float]:
    """One ``kvcli replay ... --json`` process: (document, wall seconds, CPU seconds incl. children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "kvcli", "replay", *args, "--json"], cwd=ROOT, check=True,
                         capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(out.stdout), wall, cpu


def verdict(trace: dict) -> str:
    v = trace["verdict"]
    if v["kind"] == "clear":
        return str(v["tied_chunk_sizes"][0])
    if v["kind"] == "tie":
        return "tie " + "/".join(map(str, v["tied_chunk_sizes"]))
    return v["kind"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--traces", nargs="*", default=["sample_traces/"])
    ns = ap.parse_args()
    _, base_wall, base_cpu = run([*ns.traces, "--measure", "0", "--prefill-tps", "1000", "--payload", "accounted"])
    docs, walls, cpus = [], [], []
    for i in range(ns.repeats):
        doc, wall, cpu = run(list(ns.traces))
        docs.append(doc)
        walls.append(wall)
        cpus.append(cpu)
        print(f"run {i + 1}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
    print(f"\nmain job: wall min {min(walls):.1f} / median {statistics.median(walls):.1f} s, CPU min {min(cpus):.1f} / "
          f"median {statistics.median(cpus):.1f} s; baseline (index-only) {base_wall:.1f} s wall, {base_cpu:.1f} s "
          f"CPU; ratio (median) {statistics.median(walls) / base_wall:.1f}x wall, "
          f"{statistics.median(cpus) / base_cpu:.1f}x CPU\n")
    agree = 0
    names = [t["trace"] for t in docs[0]["traces"]]
    print(f"{'trace':48s} {'verdicts':40s} same  best saved min-max (s)  max drift of a difference")
    for k, name in enumerate(names):
        traces = [d["traces"][k] for d in docs]
        verdicts = [verdict(t) for t in traces]
        same = len(set(verdicts)) == 1
        agree += same
        saved, rel = [], {}
        for t in traces:
            nets = {r["chunk_size"]: r["net_benefit_seconds"] for r in t["per_chunk_size"]}
            best = max(nets.values())
            saved.append(max(r["saved_prefill_seconds"] for r in t["per_chunk_size"]))
            if best > 0:
                for cs, v in nets.items():
                    rel.setdefault(cs, []).append(100 * (best - v) / best)
        drift = max((max(v) - min(v) for v in rel.values() if len(v) == len(traces)), default=0.0)
        print(f"{Path(name).name[:48]:48s} {', '.join(verdicts)[:40]:40s} {'yes' if same else 'NO ':4s} "
              f"{min(saved):10.4g} - {max(saved):<10.4g}  {drift:.1f} points")
    print(f"\n{agree} of {len(names)} traces: the same verdict in all {ns.repeats} runs")


if __name__ == "__main__":
    main()
