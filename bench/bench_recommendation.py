"""Is the recommendation stable, and what does the main job cost? ``kvcli replay sample_traces/`` repeated.

Runs the README's main job ``--repeats`` times (separate processes, defaults, fixed seed) and prints, per trace, the
verdict of every run (the recommended chunk size, or the sizes that tie, or none), whether all runs agree, and the
spread of the best size's saved prefill (min / max over runs) and of the relative differences between sizes (the
drift that ``TIE_TOLERANCE`` in kvcli/replay/savings.py absorbs). Time: wall and CPU (user + sys of the process and
its children: the embedded server) per run, min and median; the baseline, measured in the same run, is the same
traces replayed index-only (``--measure 0 --prefill-tps 1000 --payload accounted``: no model, no calibration).

With ``--ref COMMIT`` the main job of that commit (its ``kvcli/`` from ``git archive``, the same traces) runs too,
alternating with this checkout's, and each side's wall, CPU and peak RSS (the kvcli process, ``wait4``'s
``ru_maxrss``: its largest process, the embedded server included) and verdicts are printed, with the ratios.

    python bench/bench_recommendation.py                # 3 repeats of the main job
    python bench/bench_recommendation.py --repeats 2 --traces sample_traces/chat_shared_system.jsonl
    python bench/bench_recommendation.py --ref 8b367c8  # before / after, interleaved
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
LAST_PEAK: list[float] = [0.0]  # the last run's peak RSS, MiB


def run(args: list[str], code: Path = ROOT) -> tuple[dict, float, float]:
    """One ``kvcli replay ... --json`` process of the ``kvcli/`` in ``code``: (document, wall seconds, CPU seconds
    incl. children); its peak RSS (MiB) in ``LAST_PEAK[0]``."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kvcli", "replay", *args, "--json"], cwd=code, stdout=out,
                                stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(code)})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise SystemExit(f"kvcli replay {' '.join(args)} in {code} exited {proc.returncode}")
        out.seek(0)
        doc = json.load(out)
    LAST_PEAK[0] = usage.ru_maxrss / 1024
    return doc, wall, usage.ru_utime + usage.ru_stime


def checkout(ref: str, into: Path) -> Path:
    """``kvcli/`` of commit ``ref`` extracted under ``into``."""
    archive = subprocess.run(["git", "archive", ref, "kvcli"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def compare(ref: str, traces: list[str], repeats: int) -> None:
    """The main job at ``ref`` and here, alternating, ``repeats`` times each: wall, CPU, peak RSS and verdicts."""
    paths = [str((ROOT / t).resolve()) for t in traces]
    with tempfile.TemporaryDirectory() as tmp:
        sides = {ref: checkout(ref, Path(tmp)), "this checkout": ROOT}
        got: dict[str, dict[str, list]] = {k: {"wall": [], "cpu": [], "peak": [], "verdicts": []} for k in sides}
        for i in range(repeats):
            for name, code in sides.items():
                doc, wall, cpu = run(paths, code)
                row = got[name]
                row["wall"].append(wall)
                row["cpu"].append(cpu)
                row["peak"].append(LAST_PEAK[0])
                row["verdicts"].append([verdict(t) for t in doc["traces"]])
                print(f"run {i + 1} {name}: {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {LAST_PEAK[0]:.0f} MiB, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    print()
    for name, row in got.items():
        print(f"{name:14s} wall {_mm(row['wall'])} s, CPU {_mm(row['cpu'])} s, peak RSS {_mm(row['peak'], '.0f')} MiB "
              f"(min / median)")
    a, b = got[ref], got["this checkout"]
    print(f"ratio (this / {ref}, min / median): wall {_ratio(b['wall'], a['wall'])}, CPU {_ratio(b['cpu'], a['cpu'])},"
          f" peak RSS {_ratio(b['peak'], a['peak'])}")
    names = [Path(p).name for p in paths] if len(paths) > 1 else None
    for k in range(len(a["verdicts"][0])):
        va, vb = {r[k] for r in a["verdicts"]}, {r[k] for r in b["verdicts"]}
        label = names[k] if names else f"trace {k + 1}"
        print(f"  verdicts {label[:44]:44s} {ref}: {', '.join(sorted(va)):28s} here: {', '.join(sorted(vb))}")


def _mm(xs: list[float], spec: str = ".1f") -> str:
    return f"{min(xs):{spec}} / {statistics.median(xs):{spec}}"


def _ratio(new: list[float], old: list[float]) -> str:
    return f"{min(new) / min(old):.2f} / {statistics.median(new) / statistics.median(old):.2f}x"


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
    ap.add_argument("--ref", help="also run the main job at this commit, alternating, and compare")
    ns = ap.parse_args()
    if ns.ref:
        compare(ns.ref, ns.traces, ns.repeats)
        return
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
