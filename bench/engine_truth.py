"""kvcli explain --gpu-blocks against a real vLLM engine: per trace, the requests whose predicted reused tokens equal
vLLM's ``RequestOutput.num_cached_tokens`` exactly, and the tokens predicted against the engine's.

Run it with vLLM's Python; kvcli's part runs in kvcli's own environment as a subprocess (``--kvcli-python``, with
this tree on its PYTHONPATH):

    /work/vllm-venv/bin/python bench/engine_truth.py [--only chat_shared_system] [--engine 32/120]
        [--record tests/engine_sim/fixtures]

What it does, all on the CPU:

1. kvcli's Python writes a tiny random Llama (hidden 256, 4 query heads, 2 KV heads of head_dim 64, 2 layers,
   bfloat16, MLP 512, vocabulary 100,352 so the synthesized ids of hash-id traces fit, max_position_embeddings
   131,072 so the Mooncake cut's longest prompt fits; the Mooncake cut runs on :data:`FAST_SHAPE`) with kvcli's
   tiny tokenizer (:mod:`kvcli.model.hf_tiny`), and
   reads each trace of :data:`TRACES` (the first N requests of those in :data:`FIRST`) as ``kvcli explain
   --model`` reads it (same tokenizer, arrival order, empty prompts skipped), to token ids.
2. For each engine of :data:`ENGINES` (block size, ``num_gpu_blocks_override``, ``max_num_seqs``,
   ``max_num_batched_tokens``), a child process starts one offline ``LLM`` (prefix caching on, eager, in-process
   engine core so a batch is queued whole before the first step) and runs each pass: the trace's token ids one
   request at a time (one ``generate`` call each) or all at once (one ``generate`` call, the engine's scheduler
   interleaves them), ``max_tokens`` = the pass's output length with ``ignore_eos``; the prefix cache is reset
   between passes (a reset pool caches nothing, as a new one).
3. kvcli's Python runs ``kvcli explain TRACE --chunk-size B --gpu-blocks N --output-length L [--max-num-seqs K
   --max-num-batched-tokens T --at-once] --json`` for the same pass and the two are compared request by request.

With ``--record DIR``, each trace's engine figures go to ``DIR/<trace>.json`` (the fixtures
tests/engine_sim/test_engine_truth.py checks kvcli against without vLLM), replacing the runs of the same settings,
after each engine. It prints one table row per run as it ends: requests exact / total, kvcli's tokens against
vLLM's, the tokens (and requests) kvcli puts under ``eviction`` (what an unlimited engine would have reused
beyond), for a run at once what kvcli predicts for the same output one request at a time, kvcli's
``pinned_hit_tokens`` and ``preemptions``, and one request at a time how many requests an LRU of the pool's
``N - 1`` KV blocks gets exact. On 2 cores with little else running, everything but the Mooncake cut takes about
an hour (most of it the engines' starts, ~30 s each), the four newest traces (aiperf, Dynamo, Parquet, RAGPulse)
about ten minutes, and the Mooncake cut's six passes (1,000 requests each, on :data:`FAST_SHAPE`) about 25
minutes, two to three a pass; ``--only`` and ``--engine`` run a part.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KVCLI_PYTHON = "/work/main/.venv/bin/python"
MODEL_SHAPE = {"architecture": "LlamaForCausalLM", "hidden_size": 256, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2, "intermediate_size": 512,
               "vocab_size": 100352, "dtype": "bfloat16", "max_position_embeddings": 131072}
#: a lighter Llama for the Mooncake cut, whose prompts run to 122k tokens: one layer of one query and one KV head
#: (the engine's attention over a long prompt, most of its time on the CPU, is about 6x cheaper); same tokenizer,
#: vocabulary and positions. Which tokens are cached does not depend on the model's weights or shape.
FAST_SHAPE = {**MODEL_SHAPE, "hidden_size": 64, "num_attention_heads": 1, "num_key_value_heads": 1,
              "num_hidden_layers": 1, "intermediate_size": 128}
SHAPES = {"tiny-llama": MODEL_SHAPE, "tiny-llama-fast": FAST_SHAPE}
TOKENIZER = "kvcli.model.hf_tiny.build_tokenizer(512): byte-level BPE with a Llama-3-style chat template"

#: trace name -> file under sample_traces/: every sample trace (the CPU computes every uncached token).
TRACES = {
    "chat_shared_system": "chat_shared_system.jsonl",  # 24 chats, three cache salts
    "openai_batch_handmade": "openai_batch_handmade.jsonl",
    "tokens_small": "tokens_small.jsonl",  # token ids, two salts
    "bailian_handmade": "bailian_handmade.jsonl",  # a hash-id trace (16-token blocks, synthesized ids)
    "sharegpt_multiturn": "sharegpt_multiturn.json",
    "sharegpt_single_turn": "sharegpt_single_turn.json",  # nothing shared
    "glaive_toolcall_head30": "glaive_toolcall_head30.json",  # 101 requests
    "swe_agent_1c2844": "swe-agent_6e44b9__sweagenttestrepo-1c2844.traj",
    "swe_agent_test_repo_i1": "swe-agent__test-repo-i1.traj",  # 143k tokens, prompts of 28k to 29k
    "swe_agent_pydicom_1458": "swe-agent_pydicom__pydicom-1458.traj",  # 348k tokens, prompts of 20k to 40k
    "no_reuse": "no_reuse.jsonl",
    "mooncake_conversation_head1000": "mooncake_conversation_head1000.jsonl.gz",  # a hash-id trace (512 tokens)
    "aiperf_agentic_code_3x5": "aiperf_agentic_code_3x5.jsonl",  # 805k tokens, prompts up to 74k
    "dynamo_exgentic_handmade": "dynamo_exgentic_handmade.jsonl",
    "customer_service_handmade": "customer_service_handmade.parquet",
    "ragpulse_head60": "ragpulse_head60",  # hash ids per RAG component, 183k tokens
}

#: traces read in part: their first N requests (N lines of a JSONL trace whose lines are in arrival order); none
#: now (the Mooncake cut, 1,000 requests of 13.7 M tokens, runs whole on :data:`FAST_SHAPE`).
FIRST: dict[str, int] = {}

#: (block size, num_gpu_blocks, max_num_seqs, max_num_batched_tokens, passes); a pass is (trace, mode, output
#: tokens), mode "one" (one request at a time: max_num_seqs does not matter) or "batch" (all at once). Every trace
#: runs at block sizes 32 and 64, each with a pool that holds all of its tokens (unbounded) and with bounded ones:
#: the trace's smallest pool (its longest prompt's blocks + the null block), sizes where eviction costs reuse, the
#: pair N - 1, N around the smallest N at which one request at a time loses nothing to eviction, and pools where
#: long outputs make the engine preempt.
SMALL = ["chat_shared_system", "openai_batch_handmade", "tokens_small", "bailian_handmade", "sharegpt_multiturn",
         "sharegpt_single_turn", "glaive_toolcall_head30", "swe_agent_1c2844", "no_reuse", "dynamo_exgentic_handmade",
         "customer_service_handmade"]
LONG = ["swe_agent_test_repo_i1", "swe_agent_pydicom_1458", "ragpulse_head60"]
AIPERF = "aiperf_agentic_code_3x5"
MOONCAKE = "mooncake_conversation_head1000"
#: the model (a folder name of :data:`SHAPES`) each trace runs on; the others run on ``tiny-llama``
TRACE_MODEL = {MOONCAKE: "tiny-llama-fast"}
ENGINES: list[tuple[int, int, int, int, list[tuple[str, str, int]]]] = [
    # unbounded
    (32, 4096, 8, 2048, [(t, "one", 1) for t in SMALL] + [(t, "batch", 16) for t in SMALL]),
    (32, 16384, 8, 2048, [(t, "one", 1) for t in LONG] + [(t, "batch", 16) for t in LONG]),
    (64, 2048, 8, 2048, [(t, "one", 1) for t in SMALL] + [(t, "batch", 16) for t in SMALL]),
    (64, 8192, 8, 2048, [(t, "one", 1) for t in LONG] + [(t, "batch", 16) for t in LONG]),
    # bounded, block 32
    (32, 55, 4, 512, [("chat_shared_system", "one", 1), ("chat_shared_system", "batch", 8)]),
    (32, 120, 8, 512, [("chat_shared_system", "one", 1), ("chat_shared_system", "one", 40),
                       ("chat_shared_system", "batch", 8)]),
    (32, 192, 8, 2048, [("chat_shared_system", "one", 1)]),
    (32, 193, 8, 2048, [("chat_shared_system", "one", 1)]),
    (32, 11, 2, 256, [("bailian_handmade", "one", 1), ("bailian_handmade", "batch", 4)]),
    (32, 16, 4, 512, [("bailian_handmade", "one", 1), ("bailian_handmade", "one", 16),
                      ("bailian_handmade", "batch", 8)]),
    (32, 23, 4, 2048, [("bailian_handmade", "one", 1)]),
    (32, 24, 4, 2048, [("bailian_handmade", "one", 1)]),
    (32, 6, 2, 2048, [("openai_batch_handmade", "one", 1), ("openai_batch_handmade", "batch", 2),
                      ("tokens_small", "one", 1), ("tokens_small", "batch", 2)]),
    (32, 99, 8, 2048, [("glaive_toolcall_head30", "one", 1)]),
    (32, 400, 8, 1024, [("glaive_toolcall_head30", "one", 1), ("glaive_toolcall_head30", "one", 32),
                        ("glaive_toolcall_head30", "batch", 32)]),
    (32, 836, 8, 2048, [("glaive_toolcall_head30", "one", 1)]),
    (32, 837, 8, 2048, [("glaive_toolcall_head30", "one", 1)]),
    (32, 147, 4, 2048, [("sharegpt_multiturn", "one", 1), ("swe_agent_1c2844", "one", 1),
                        ("sharegpt_multiturn", "batch", 8), ("swe_agent_1c2844", "batch", 8)]),
    (32, 15, 4, 2048, [("no_reuse", "one", 1), ("no_reuse", "batch", 4)]),
    (32, 114, 4, 2048, [("sharegpt_single_turn", "one", 1), ("sharegpt_single_turn", "batch", 4)]),
    (32, 923, 4, 2048, [("swe_agent_test_repo_i1", "one", 1), ("swe_agent_test_repo_i1", "batch", 4)]),
    (32, 1237, 4, 2048, [("swe_agent_pydicom_1458", "one", 1), ("swe_agent_pydicom_1458", "batch", 4)]),
    (32, 313, 4, 2048, [("dynamo_exgentic_handmade", "one", 1), ("dynamo_exgentic_handmade", "batch", 4)]),
    (32, 14, 2, 2048, [("customer_service_handmade", "one", 1), ("customer_service_handmade", "batch", 2)]),
    (32, 217, 4, 2048, [("ragpulse_head60", "one", 1), ("ragpulse_head60", "batch", 4)]),
    # bounded, block 64
    (64, 28, 2, 1024, [("chat_shared_system", "one", 1), ("chat_shared_system", "batch", 8)]),
    (64, 95, 4, 2048, [("chat_shared_system", "one", 1)]),
    (64, 96, 4, 2048, [("chat_shared_system", "one", 1), ("chat_shared_system", "batch", 16)]),
    (64, 10, 4, 2048, [("bailian_handmade", "one", 1), ("bailian_handmade", "batch", 4)]),
    (64, 11, 4, 2048, [("bailian_handmade", "one", 1)]),
    (64, 200, 8, 2048, [("glaive_toolcall_head30", "one", 1), ("glaive_toolcall_head30", "batch", 32)]),
    (64, 4, 2, 2048, [("openai_batch_handmade", "one", 1), ("openai_batch_handmade", "batch", 2)]),
    (64, 2, 2, 2048, [("tokens_small", "one", 1), ("tokens_small", "batch", 2)]),
    (64, 67, 4, 2048, [("sharegpt_multiturn", "one", 1), ("sharegpt_multiturn", "batch", 8)]),
    (64, 74, 4, 2048, [("swe_agent_1c2844", "one", 1), ("swe_agent_1c2844", "batch", 8)]),
    (64, 8, 4, 2048, [("no_reuse", "one", 1), ("no_reuse", "batch", 4)]),
    (64, 58, 4, 2048, [("sharegpt_single_turn", "one", 1), ("sharegpt_single_turn", "batch", 4)]),
    (64, 462, 4, 2048, [("swe_agent_test_repo_i1", "one", 1), ("swe_agent_test_repo_i1", "batch", 4)]),
    (64, 619, 4, 2048, [("swe_agent_pydicom_1458", "one", 1), ("swe_agent_pydicom_1458", "batch", 4)]),
    (64, 157, 4, 2048, [("dynamo_exgentic_handmade", "one", 1), ("dynamo_exgentic_handmade", "batch", 4)]),
    (64, 8, 2, 2048, [("customer_service_handmade", "one", 1), ("customer_service_handmade", "batch", 2)]),
    (64, 109, 4, 2048, [("ragpulse_head60", "one", 1), ("ragpulse_head60", "batch", 4)]),
    # long outputs on a tight pool: running requests' decode blocks preempt others
    (32, 18, 4, 2048, [("bailian_handmade", "one", 128), ("bailian_handmade", "batch", 128)]),
    (32, 21, 8, 2048, [("bailian_handmade", "batch", 128)]),
    (32, 13, 8, 2048, [("openai_batch_handmade", "one", 128), ("openai_batch_handmade", "batch", 128)]),
    (32, 112, 8, 2048, [("glaive_toolcall_head30", "batch", 128)]),
    # the aiperf agentic sessions (805k tokens): unbounded, and a pool where eviction costs reuse
    (32, 25200, 8, 2048, [(AIPERF, "one", 1), (AIPERF, "batch", 16)]),
    (32, 2781, 4, 2048, [(AIPERF, "one", 1), (AIPERF, "batch", 4)]),
    (64, 12600, 8, 2048, [(AIPERF, "one", 1), (AIPERF, "batch", 16)]),
    (64, 1392, 4, 2048, [(AIPERF, "one", 1), (AIPERF, "batch", 4)]),
    # the Mooncake cut (its 1,000 requests, on FAST_SHAPE): unbounded, and a pool where eviction costs a fifth of
    # its reuse (at once there only)
    (32, 431000, 8, 2048, [(MOONCAKE, "one", 1)]),
    (32, 150000, 8, 2048, [(MOONCAKE, "one", 1), (MOONCAKE, "batch", 16)]),
    (64, 216500, 8, 2048, [(MOONCAKE, "one", 1)]),
    (64, 75000, 8, 2048, [(MOONCAKE, "one", 1), (MOONCAKE, "batch", 16)]),
]


# -- kvcli's side (kvcli's Python) ---------------------------------------------------------------------------------

def kvcli_build(model_dir: str, shape_name: str = "tiny-llama") -> None:
    """Write the tiny checkpoint of :data:`SHAPES` ``shape_name`` (module docstring) into ``model_dir``."""
    from kvcli.model.hf_tiny import write_tiny_checkpoint

    shape = SHAPES[shape_name]
    write_tiny_checkpoint(model_dir, vocab=shape["vocab_size"], dtype=shape["dtype"], layers=shape["num_hidden_layers"],
                          hidden_size=shape["hidden_size"], head_dim=shape["head_dim"],
                          num_attention_heads=shape["num_attention_heads"],
                          num_key_value_heads=shape["num_key_value_heads"],
                          intermediate_size=shape["intermediate_size"],
                          max_position_embeddings=shape["max_position_embeddings"])


def model_of(trace: str) -> str:
    """The :data:`SHAPES` name of the model ``trace`` runs on."""
    return TRACE_MODEL.get(trace, "tiny-llama")


def kvcli_tokens(trace: str, model_dir: str) -> None:
    """Print the trace's requests as ``kvcli explain --model model_dir`` takes them: one JSON line each (id, cache
    salt, token ids), in arrival order, empty prompts skipped."""
    from kvcli.analysis.workload import each_trace, ordered_requests

    for path, name, tok in each_trace([Path(trace)], "auto", None, model_dir):
        requests, _ = ordered_requests(path, "auto", tok, name)
        for r in requests:
            if len(r.token_ids):
                print(json.dumps({"id": r.id, "cache_salt": r.cache_salt, "token_ids": r.token_ids.tolist()}))


def kvcli_predict(kvcli_python: str, trace: Path, model_dir: Path, block_size: int, blocks: int, max_num_seqs: int,
                  batched: int, mode: str, output: int) -> dict:
    """kvcli explain's figures for one pass (module docstring, step 3): its JSON's trace body."""
    options = ["--gpu-blocks", str(blocks), "--output-length", str(output)]
    if mode == "batch":
        options += ["--max-num-seqs", str(max_num_seqs), "--max-num-batched-tokens", str(batched), "--at-once"]
    return kvcli_explain(kvcli_python, trace, model_dir, block_size, options)


def kvcli_explain(kvcli_python: str, trace: Path, model_dir: Path, block_size: int, options: list[str]) -> dict:
    """``kvcli explain TRACE --chunk-size B --model DIR OPTIONS --json``: the JSON's one trace body (``per_request``
    with each request's ``reused_tokens`` and ``lost_tokens_by_cause``; ``engine`` with ``pinned_hit_tokens`` and
    ``preemptions``). With ``--capacity-tokens (N - 1) * B`` instead of the engine's options it is the LRU of the
    pool's KV blocks, the prediction before ``--gpu-blocks``, for comparison."""
    cmd = [kvcli_python, "-m", "kvcli", "explain", str(trace), "--chunk-size", str(block_size), "--model",
           str(model_dir), *options, "--json"]
    out = subprocess.run(cmd, env=kvcli_env(), capture_output=True, text=True, check=True)
    (body,) = json.loads(out.stdout)["traces"]
    return body


def reused(body: dict) -> list[int]:
    """Each request's predicted reused tokens, from a :func:`kvcli_explain` body."""
    return [r["reused_tokens"] for r in body["per_request"]]


def kvcli_env() -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


# -- the engine's side (vLLM's Python) -----------------------------------------------------------------------------

def engine_prompts(tokens_file: str | Path) -> list:
    """vLLM's ``TokensPrompt`` of each request of a token file (:func:`kvcli_tokens`' lines: id, cache salt, token
    ids), its cache salt where it has one. Run in vLLM's Python."""
    from vllm.inputs import TokensPrompt

    prompts = []
    for line in Path(tokens_file).read_text().splitlines():
        r = json.loads(line)
        prompt = TokensPrompt(prompt_token_ids=r["token_ids"])
        if r["cache_salt"]:
            prompt["cache_salt"] = r["cache_salt"]
        prompts.append(prompt)
    return prompts


def engine_child(spec_path: str) -> None:
    """One engine (a child process of its own): run every pass of the spec, write ``{pass: [cached tokens]}``."""
    from vllm import LLM, SamplingParams

    spec = json.loads(Path(spec_path).read_text())
    llm = LLM(model=spec["model"], dtype="bfloat16", block_size=spec["block_size"], enable_prefix_caching=True,
              enforce_eager=True, num_gpu_blocks_override=spec["blocks"], max_model_len=spec["max_model_len"],
              max_num_seqs=spec["max_num_seqs"], max_num_batched_tokens=spec["batched"], seed=0)
    results = {}
    for key, (tokens_file, mode, output) in spec["passes"].items():
        llm.reset_prefix_cache()
        prompts = engine_prompts(tokens_file)
        params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
        started = time.perf_counter()
        if mode == "one":
            outputs = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
        else:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        results[key] = [o.num_cached_tokens for o in outputs]
        print(f"  {key}: {len(prompts)} requests in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    Path(spec["out"]).write_text(json.dumps(results))


def run_engine(work: Path, model_dir: Path, tokens: dict[str, Path], lengths: dict[str, int], engine) -> dict:
    """Start one engine in a child process and run its passes; ``{(trace, mode, output): [cached tokens]}``."""
    block_size, blocks, seqs, batched, passes = engine
    (model_name,) = {model_of(t) for t, _, _ in passes}  # one engine, one model
    model_dir = model_dir.parent / model_name
    longest = max(lengths[t] + out for t, _, out in passes)
    max_model_len = -(-longest // block_size) * block_size
    if max_model_len > (blocks - 1) * block_size:
        raise SystemExit(f"{blocks} blocks of {block_size} cannot hold a request of {longest} tokens")
    name = f"b{block_size}-n{blocks}-s{seqs}-t{batched}"
    spec = {"model": str(model_dir), "block_size": block_size, "blocks": blocks, "max_num_seqs": seqs,
            "batched": batched, "max_model_len": max_model_len, "out": str(work / f"{name}.out.json"),
            "passes": {f"{t}|{m}|{o}": (str(tokens[t]), m, o) for t, m, o in passes}}
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    # the pool's KV: K and V of every layer's KV heads, 2 bytes each (bfloat16), per token
    shape = SHAPES[model_name]
    per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * 2
    kv_bytes = blocks * block_size * per_token
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": str(max(1, -(-kv_bytes // 2**30))),
                        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING",
                        "TOKENIZERS_PARALLELISM": "false"}
    print(f"== engine {name}", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, __file__, "engine", str(spec_path)], env=env, check=True)
    raw = json.loads(Path(spec["out"]).read_text())
    return {tuple(k.split("|")[:2]) + (int(k.split("|")[2]),): v for k, v in raw.items()}


# -- the comparison --------------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kvcli-python", default=KVCLI_PYTHON, help="kvcli's Python (default: %(default)s)")
    parser.add_argument("--only", action="append", help="run only these traces (repeatable)")
    parser.add_argument("--engine", action="append", metavar="B/N",
                        help="run only the engines of block size B and N blocks (repeatable), e.g. 32/18")
    parser.add_argument("--record", type=Path, help="write each trace's engine figures here (the test fixtures)")
    parser.add_argument("--work", type=Path, help="keep the model and token files here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvcli-engine-truth-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        return compare(args, work)


def trace_file(trace: str, work: Path) -> Path:
    """The file both sides read for ``trace``: the sample trace, or for one of :data:`FIRST` its first N lines,
    uncompressed, in ``work``."""
    source = ROOT / "sample_traces" / TRACES[trace]
    if trace not in FIRST:
        return source
    cut = work / f"{trace}.first{FIRST[trace]}.jsonl"
    if not cut.exists():
        with (gzip.open(source, "rt") if source.suffix == ".gz" else source.open()) as f:
            lines = [line for _, line in zip(range(FIRST[trace]), f)]
        cut.write_text("".join(lines))
    return cut


HEADER = ("| trace | block | gpu blocks | seqs | batched | output | exact / requests | kvcli tokens | vLLM tokens | "
          "eviction: tokens (requests) | kvcli one at a time | pinned hit tokens | preemptions | "
          "LRU of N - 1 blocks: exact |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def compare(args, work: Path) -> int:
    """Run the engines of :data:`ENGINES` (those ``--only`` and ``--engine`` leave) and kvcli beside them; print
    one table row per pass as it ends, and with ``--record`` write the fixtures after each engine. 0: every
    request of every pass exact."""
    model_dir = work / "tiny-llama"  # its tokenizer reads every trace (the fast model's is the same)
    traces = [t for t in TRACES if not args.only or t in args.only]
    for name in {"tiny-llama"} | {model_of(t) for t in traces}:
        if not (work / name / "config.json").exists():
            subprocess.run([args.kvcli_python, __file__, "kvcli-build", str(work / name), name], env=kvcli_env(),
                           check=True)
    tokens, lengths, meta, files = {}, {}, {}, {}
    for t in traces:
        files[t] = trace_file(t, work)
        path = work / f"{t}.tokens.jsonl"
        if not path.exists():
            out = subprocess.run([args.kvcli_python, __file__, "kvcli-tokens", str(files[t]), str(model_dir)],
                                 env=kvcli_env(), capture_output=True, text=True, check=True)
            path.write_text(out.stdout)
        requests = [json.loads(line) for line in path.read_text().splitlines()]
        tokens[t], lengths[t] = path, max(len(r["token_ids"]) for r in requests)
        meta[t] = {"ids": [r["id"] for r in requests], "prompt_tokens": [len(r["token_ids"]) for r in requests],
                   "token_digest": token_digest([r["token_ids"] for r in requests])}
        if t in FIRST:
            meta[t]["first_requests"] = FIRST[t]
    print(HEADER, flush=True)
    all_exact = True
    for engine in ENGINES:
        block_size, blocks, seqs, batched, passes = engine
        passes = [p for p in passes if p[0] in traces]
        if not passes or args.engine and f"{block_size}/{blocks}" not in args.engine:
            continue
        truth = run_engine(work, model_dir, tokens, lengths, (block_size, blocks, seqs, batched, passes))
        fixtures: dict[str, list] = {t: [] for t in traces}
        for (t, mode, output), cached in truth.items():
            body = kvcli_predict(args.kvcli_python, files[t], model_dir, block_size, blocks, seqs, batched, mode,
                                 output)
            predicted = reused(body)
            exact = sum(a == b for a, b in zip(predicted, cached))
            all_exact &= exact == len(cached)
            evicted = [r["lost_tokens_by_cause"]["eviction"] for r in body["per_request"]]
            lru = alone = "–"
            if mode == "one" and output == 1:
                lru_reused = reused(kvcli_explain(args.kvcli_python, files[t], model_dir, block_size,
                                                  ["--capacity-tokens", str((blocks - 1) * block_size)]))
                lru = f"{sum(a == b for a, b in zip(lru_reused, cached))} / {len(cached)}"
            if mode == "batch":
                one = kvcli_predict(args.kvcli_python, files[t], model_dir, block_size, blocks, 1, batched, "one",
                                    output)
                alone = f"{sum(reused(one)):,}"
            print(f"| {t} | {block_size} | {blocks:,} | {seqs if mode == 'batch' else 'one at a time'} | {batched:,} | "
                  f"{output} | {exact} / {len(cached)} | {sum(predicted):,} | {sum(cached):,} | "
                  f"{sum(evicted):,} ({sum(e > 0 for e in evicted)}) | {alone} | "
                  f"{body['engine']['pinned_hit_tokens']:,} | {body['engine']['preemptions']} | {lru} |", flush=True)
            fixtures[t].append({"block_size": block_size, "gpu_blocks": blocks,
                                "max_num_seqs": seqs if mode == "batch" else 1, "max_num_batched_tokens": batched,
                                "arrivals": "at once" if mode == "batch" else "one at a time",
                                "output_tokens": output, "cached_tokens": cached})
        if args.record:
            record(args.record, traces, meta, fixtures)
    return 0 if all_exact else 1


def token_digest(prompts: list[list[int]]) -> str:
    """sha256 over every request's token ids (uint32 little-endian) and a length ahead of each."""
    h = hashlib.sha256()
    for ids in prompts:
        h.update(len(ids).to_bytes(4, "little"))
        h.update(b"".join(i.to_bytes(4, "little") for i in ids))
    return h.hexdigest()


def record(folder: Path, traces: list[str], meta: dict, fixtures: dict) -> None:
    """One fixture per trace (module docstring): this run's runs replace those of the same settings in the file,
    the others stay unless the file was made with another model or other token ids (then they go)."""
    import vllm

    folder.mkdir(parents=True, exist_ok=True)
    for t in traces:
        if not fixtures[t]:
            continue
        path = folder / f"{t}.json"
        old = json.loads(path.read_text()) if path.exists() else {"runs": []}
        shape = SHAPES[model_of(t)]
        same = old.get("model") == shape and old.get("token_digest") == meta[t]["token_digest"]
        runs = {_run_key(r): r for r in (old["runs"] if same else [])}
        runs.update({_run_key(r): r for r in fixtures[t]})
        doc = {"trace": f"sample_traces/{TRACES[t]}", "vllm_version": vllm.__version__,
               "command": "/work/vllm-venv/bin/python bench/engine_truth.py --record tests/engine_sim/fixtures",
               "engine": "vllm.LLM(enable_prefix_caching=True, enforce_eager=True, num_gpu_blocks_override=N, "
                         "block_size=B, max_num_seqs=S, max_num_batched_tokens=T, seed=0) on the CPU, "
                         "VLLM_ENABLE_V1_MULTIPROCESSING=0; SamplingParams(max_tokens=output_tokens, "
                         "temperature=0, ignore_eos=True); prefix cache reset before each run",
               "model": shape, "tokenizer": TOKENIZER, **meta[t], "runs": [runs[k] for k in sorted(runs)]}
        path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")


def _run_key(run: dict) -> tuple:
    return (run["block_size"], run["gpu_blocks"], run["max_num_seqs"], run["max_num_batched_tokens"],
            run["output_tokens"])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "engine":
        engine_child(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "kvcli-build":
        kvcli_build(*sys.argv[2:4])
    elif len(sys.argv) > 1 and sys.argv[1] == "kvcli-tokens":
        kvcli_tokens(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
