"""kvcli's time model against a real vLLM engine: requests that arrive at their trace timestamps (``kvcli explain
--gpu-blocks N --max-num-seqs S`` without ``--at-once``), fed to vLLM's offline engine at those times on the wall
clock, and what kvcli predicts for them: each request's cached tokens and the time the engine admitted it.

Run it with vLLM's Python, as bench/engine_truth.py (same tiny Llama, tokenizer and token ids; kvcli's side in
kvcli's Python):

    /work/vllm-venv/bin/python bench/engine_timing.py [--only chat_shared_system]

Per scenario of :data:`SCENARIOS` (trace, block size, ``num_gpu_blocks``, ``max_num_seqs``,
``max_num_batched_tokens``, output tokens, time scale ``s``):

1. A child process starts one offline ``LLM`` (prefix caching, eager, in-process engine core), warms it up, and
   runs the trace :data:`REPEATS` times, the prefix cache reset before each: request ``i`` is added
   (``LLMEngine.add_request``) before the first step that starts at or after ``s * timestamp_i`` seconds from the
   run's start, and ``LLMEngine.step`` runs while any request is unfinished (an idle engine sleeps until the next
   arrival). A wrapper around the scheduler's ``schedule`` logs each step: its start, its scheduled tokens, and
   the requests it schedules for the first time (their admission). Each request's ``num_cached_tokens`` comes
   from its ``RequestOutput``.
2. The engine's own step time is fitted as ``a + tokens / r`` over every step of every run
   (:func:`fit_step_time`); kvcli's clock is in trace seconds, so it is given
   ``--step-seconds a / s --prefill-tokens-per-second r * s``.
3. kvcli explain runs the scenario with those two figures, and with its defaults (0.02 s, 10,000 tokens/s,
   scaled the same way), and each request's predicted cached tokens and admission time (kvcli's clock times
   ``s``; :class:`kvcli.sim.scheduler.EngineSim`, whose cached tokens equal explain's) are compared with the
   engine's.

It prints one row per scenario and run: requests exact, tokens, and the admission times' error (median and
largest, seconds). The engine's timing is the machine's: on shared cores a step takes what the other processes
leave it, so two runs of one scenario differ too (the "vLLM run to run" rows).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine_truth import KVCLI_PYTHON, ROOT, engine_prompts, kvcli_env, kvcli_explain, reused, trace_file

REPEATS = 3
#: (trace, block size, num_gpu_blocks, max_num_seqs, max_num_batched_tokens, output tokens, time scale). Pools
#: where eviction decides some requests one at a time; outputs long enough that requests overlap at the scaled
#: timestamps.
SCENARIOS = [
    ("chat_shared_system", 32, 120, 8, 512, 64, 0.2),
    ("chat_shared_system", 32, 120, 8, 512, 64, 0.05),
    ("bailian_handmade", 32, 16, 4, 512, 32, 0.1),
    ("bailian_handmade", 32, 16, 4, 512, 32, 0.02),
]


# -- kvcli's side (kvcli's Python) ---------------------------------------------------------------------------------

def kvcli_admissions(spec_path: str) -> None:
    """Print kvcli's admission of each request (its cached tokens and time, trace seconds) for the scenario in the
    spec file, with the spec's step time and rate: :class:`kvcli.sim.scheduler.EngineSim` over the token ids the
    engine was given, one key per full block (a chained sha256 of the salt and the block's tokens)."""
    from kvcli.sim.scheduler import EngineConfig, EngineRequest, EngineSim

    spec = json.loads(Path(spec_path).read_text())
    bs = spec["block_size"]
    sim = EngineSim(EngineConfig(spec["blocks"], bs, spec["max_num_seqs"], spec["batched"],
                                 step_seconds=spec["step_seconds"],
                                 prefill_tokens_per_second=spec["prefill_tokens_per_second"]))
    out = []
    for i, line in enumerate(Path(spec["tokens"]).read_text().splitlines()):
        r = json.loads(line)
        h = hashlib.sha256(r["cache_salt"].encode())
        keys = []
        for j in range(len(r["token_ids"]) // bs):
            h.update(b"".join(t.to_bytes(4, "little") for t in r["token_ids"][j * bs:(j + 1) * bs]))
            keys.append(h.copy().digest())
        a = sim.admit(EngineRequest(i, keys, len(r["token_ids"]), spec["output"], r["timestamp"]))
        out.append({"cached_tokens": a.cached_tokens, "time": a.time})
    print(json.dumps(out))


def kvcli_timestamps(trace: str, model_dir: str) -> None:
    """Print each request's timestamp (seconds; 0 where the trace has none), in the order
    bench/engine_truth.py's ``kvcli-tokens`` prints the requests."""
    from kvcli.analysis.workload import each_trace, ordered_requests

    for path, name, tok in each_trace([Path(trace)], "auto", None, model_dir):
        requests, _ = ordered_requests(path, "auto", tok, name)
        print(json.dumps([r.timestamp or 0.0 for r in requests if len(r.token_ids)]))


# -- the engine's side (vLLM's Python) -----------------------------------------------------------------------------

def engine_child(spec_path: str) -> None:
    """One engine: run the scenario :data:`REPEATS` times at the scaled arrival times (module docstring, step 1);
    write ``[{"cached": [...], "admitted": [...], "steps": [[start, tokens], ...]}]`` per run, times in seconds
    from the run's start."""
    from vllm import LLM, SamplingParams

    spec = json.loads(Path(spec_path).read_text())
    llm = LLM(model=spec["model"], dtype="bfloat16", block_size=spec["block_size"], enable_prefix_caching=True,
              enforce_eager=True, num_gpu_blocks_override=spec["blocks"], max_model_len=spec["max_model_len"],
              max_num_seqs=spec["max_num_seqs"], max_num_batched_tokens=spec["batched"], seed=0)
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    schedule = scheduler.schedule
    log: list[tuple[float, int, list[str]]] = []

    def logged_schedule(*args, **kwargs):
        start = time.perf_counter()
        out = schedule(*args, **kwargs)
        log.append((start, out.total_num_scheduled_tokens, [r.req_id for r in out.scheduled_new_reqs]))
        return out

    scheduler.schedule = logged_schedule
    requests = [json.loads(line) for line in Path(spec["tokens"]).read_text().splitlines()]
    params = SamplingParams(max_tokens=spec["output"], temperature=0.0, ignore_eos=True)
    prompts = engine_prompts(spec["tokens"])
    llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up
    runs = []
    for _ in range(spec["repeats"]):
        llm.reset_prefix_cache()
        log.clear()
        cached: dict[int, int] = {}
        pending = list(range(len(requests)))
        t0 = time.perf_counter()
        while pending or engine.has_unfinished_requests():
            now = time.perf_counter() - t0
            while pending and spec["scale"] * requests[pending[0]]["timestamp"] <= now:
                i = pending.pop(0)
                engine.add_request(f"r{i}", prompts[i], params)
            if not engine.has_unfinished_requests():
                time.sleep(max(0.0, spec["scale"] * requests[pending[0]]["timestamp"] - now))
                continue
            for out in engine.step():
                if out.finished:
                    cached[int(out.request_id[1:])] = out.num_cached_tokens
        end = time.perf_counter() - t0
        admitted: dict[int, float] = {}
        for start, _, new in log:
            for req_id in new:
                admitted.setdefault(int(req_id.rsplit("-", 1)[0][1:]), start - t0)
        runs.append({"cached": [cached[i] for i in range(len(requests))],
                     "admitted": [admitted[i] for i in range(len(requests))],
                     "steps": [[s - t0, n] for s, n, _ in log], "end": end})
    Path(spec["out"]).write_text(json.dumps(runs))


def fit_step_time(runs: list[dict], seqs: int) -> tuple[float, float]:
    """The engine's step time as ``a + tokens / r`` (a step's time: from its start to the next step's start, the
    run's end for its last step): ``a`` the median of the steps that schedule at most ``seqs`` tokens (decode
    steps), ``r`` the median of ``tokens / (time - a)`` over the others (prefill), medians because a shared
    machine makes some steps many times slower than the rest."""
    decode, prefill = [], []
    for run in runs:
        steps = run["steps"]
        ends = [s for s, _ in steps[1:]] + [run["end"]]
        for (start, tokens), end in zip(steps, ends):
            (decode if tokens <= seqs else prefill).append((tokens, end - start))
    a = statistics.median(t for _, t in decode)
    return a, statistics.median(n / (t - a) for n, t in prefill if t > a)


# -- the comparison --------------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kvcli-python", default=KVCLI_PYTHON, help="kvcli's Python (default: %(default)s)")
    parser.add_argument("--only", action="append", help="run only these traces (repeatable)")
    parser.add_argument("--work", type=Path, help="keep the model and token files here (default: a temporary folder)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="runs per scenario (default: %(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvcli-engine-timing-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        return compare(args, work)


def _kvcli(args, *argv: str) -> str:
    return subprocess.run([args.kvcli_python, __file__, *argv], env=kvcli_env(), capture_output=True, text=True,
                          check=True).stdout


def compare(args, work: Path) -> int:
    """Run every scenario (those ``--only`` leaves) and print the rows (module docstring)."""
    model_dir = work / "tiny-llama"
    if not (model_dir / "config.json").exists():
        subprocess.run([args.kvcli_python, str(ROOT / "bench" / "engine_truth.py"), "kvcli-build", str(model_dir)],
                       env=kvcli_env(), check=True)
    print("| trace | block | gpu blocks | seqs | batched | output | time scale | compared | kvcli's --step-seconds, "
          "--prefill-tokens-per-second | "
          "exact / requests | kvcli tokens | vLLM tokens | admission error: median, largest |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for trace, bs, blocks, seqs, batched, output, scale in SCENARIOS:
        if args.only and trace not in args.only:
            continue
        path = trace_file(trace, work)
        tokens = work / f"{trace}.timed.jsonl"
        if not tokens.exists():
            lines = subprocess.run([args.kvcli_python, str(ROOT / "bench" / "engine_truth.py"), "kvcli-tokens",
                                    str(path), str(model_dir)], env=kvcli_env(), capture_output=True, text=True,
                                   check=True).stdout.splitlines()
            stamps = json.loads(_kvcli(args, "kvcli-timestamps", str(path), str(model_dir)))
            tokens.write_text("".join(json.dumps(json.loads(line) | {"timestamp": t}) + "\n"
                                      for line, t in zip(lines, stamps)))
        requests = [json.loads(line) for line in tokens.read_text().splitlines()]
        longest = max(len(r["token_ids"]) for r in requests) + output
        name = f"{trace}-b{bs}-n{blocks}-s{seqs}-t{batched}-o{output}-x{scale}"
        spec = {"model": str(model_dir), "block_size": bs, "blocks": blocks, "max_num_seqs": seqs, "batched": batched,
                "max_model_len": -(-longest // bs) * bs, "output": output, "scale": scale, "repeats": args.repeats,
                "tokens": str(tokens), "out": str(work / f"{name}.out.json")}
        spec_path = work / f"{name}.spec.json"
        spec_path.write_text(json.dumps(spec))
        env = os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING",
                            "TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": "1"}
        print(f"== {name}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, __file__, "engine", str(spec_path)], env=env, check=True)
        runs = json.loads(Path(spec["out"]).read_text())
        a, r = fit_step_time(runs, seqs)
        print(f"   {name}: load average {os.getloadavg()[0]:.1f}; vLLM's steps fitted as {a * 1000:.1f} ms + "
              f"tokens / {r:,.0f} per s", file=sys.stderr, flush=True)
        for label, step, rate in (("fitted", a, r), ("kvcli's defaults", 0.02 * scale, 10_000 / scale)):
            kv_spec = spec | {"step_seconds": step / scale, "prefill_tokens_per_second": rate * scale}
            kv_path = work / f"{name}.kvcli.json"
            kv_path.write_text(json.dumps(kv_spec))
            predicted = json.loads(_kvcli(args, "kvcli-admissions", str(kv_path)))
            cli = reused(kvcli_explain(args.kvcli_python, path, model_dir, bs, [
                "--gpu-blocks", str(blocks), "--max-num-seqs", str(seqs), "--max-num-batched-tokens", str(batched),
                "--output-length", str(output), "--step-seconds", repr(step / scale),
                "--prefill-tokens-per-second", repr(rate * scale)]))
            if cli != [p["cached_tokens"] for p in predicted]:
                raise SystemExit(f"{name}: kvcli explain and EngineSim disagree: {cli} {predicted}")
            for k, run in enumerate(runs, 1):
                _row(trace, bs, blocks, seqs, batched, output, scale, f"kvcli ({label}) against vLLM run {k}",
                     f"{step / scale:.4g} s, {rate * scale:,.0f} /s", cli, run["cached"],
                     [p["time"] * scale for p in predicted], run["admitted"])
        for k, run in enumerate(runs[1:], 2):
            _row(trace, bs, blocks, seqs, batched, output, scale, f"vLLM run 1 against run {k}", "–", runs[0]["cached"],
                 run["cached"], runs[0]["admitted"], run["admitted"])
    return 0


def _row(trace, bs, blocks, seqs, batched, output, scale, label, step, predicted, cached, at, admitted) -> None:
    exact = sum(p == c for p, c in zip(predicted, cached))
    errors = [abs(p - q) for p, q in zip(at, admitted)]
    print(f"| {trace} | {bs} | {blocks:,} | {seqs} | {batched:,} | {output} | {scale} | {label} | {step} | "
          f"{exact} / {len(cached)} | {sum(predicted):,} | {sum(cached):,} | "
          f"{statistics.median(errors):.3f} s, {max(errors):.3f} s |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "engine":
        engine_child(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "kvcli-admissions":
        kvcli_admissions(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "kvcli-timestamps":
        kvcli_timestamps(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
