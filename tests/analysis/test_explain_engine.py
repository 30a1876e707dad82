"""kvcli explain --gpu-blocks: a vLLM engine's block pool instead of an LRU, counted by hand on a small token-id
trace, its causes against the LRU's, and the engine options' checks (hypothesis: any values end in exit 0 or a
one-line refusal, exit 2, and exit 0 exactly when every value is valid)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.analysis.explain import CAUSES, ExplainConfig
from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.sim.scheduler import EngineConfig

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def run(*args, code: int = 0):
    out = CliRunner().invoke(app, [str(a) for a in args])
    assert out.exit_code == code, out.output
    return out


def write(path: Path, prompts: list[list[int]]) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "timestamp": i, "token_ids": p}) + "\n"
                            for i, p in enumerate(prompts)))
    return path


def per_request(out) -> list[dict]:
    (trace,) = json.loads(out.stdout)["traces"]
    return trace["per_request"]


A, B = list(range(1, 9)), list(range(100, 106))  # a: two 4-token blocks; b: one block and 2 tokens


def test_the_engine_reuses_what_its_pool_holds_by_hand(tmp_path):
    # 4 GPU blocks = 3 KV blocks. r0 caches a0 a1; r1 (b) takes the never-used block and a1 (the chain's tail:
    # its partial block needs a block too); r2 (a + 1 token) finds a0 only. An LRU of the 3 KV blocks keeps a1.
    trace = write(tmp_path / "t.jsonl", [A, B, A + [9]])
    engine = per_request(run("explain", trace, "--chunk-size", 4, "--gpu-blocks", 4, "--output-length", 1, "--json"))
    assert [r["reused_tokens"] for r in engine] == [0, 0, 4]
    assert engine[2]["lost_tokens_by_cause"] == {**dict.fromkeys(CAUSES, 0), "eviction": 4, "new": 1}
    lru = per_request(run("explain", trace, "--chunk-size", 4, "--capacity-tokens", 12, "--json"))
    assert [r["reused_tokens"] for r in lru] == [0, 0, 8]


def test_a_whole_cached_prompt_of_whole_blocks_loses_its_last_block_to_the_boundary(tmp_path):
    # the engine looks up at most (8 - 1) // 4 blocks: the second request reuses 4 tokens; the 3 tokens kvcli's
    # chunk store would add are the chunk boundary's, the last token the last-token rule's
    trace = write(tmp_path / "t.jsonl", [A, A])
    second = per_request(run("explain", trace, "--chunk-size", 4, "--gpu-blocks", 100, "--json"))[1]
    assert second["reused_tokens"] == 4 and second["upper_bound_tokens"] == 7
    assert second["lost_tokens_by_cause"] == {**dict.fromkeys(CAUSES, 0), "chunk_boundary": 3, "last_token": 1}


def test_the_trace_output_lengths_take_blocks(tmp_path):
    # c0 cached in block 1 behind two never-used blocks; r1's 8 prompt and 5 output tokens need 3 blocks, the last
    # of which evicts c0 (with --output-length 1 it stays)
    path = tmp_path / "t.jsonl"
    rows = [(list(range(200, 204)), 1), (A, 5), (list(range(200, 205)), 1)]
    path.write_text("".join(json.dumps({"id": f"r{i}", "timestamp": i, "token_ids": p, "output_length": o}) + "\n"
                            for i, (p, o) in enumerate(rows)))
    traced = per_request(run("explain", path, "--chunk-size", 4, "--gpu-blocks", 4, "--json"))
    single = per_request(run("explain", path, "--chunk-size", 4, "--gpu-blocks", 4, "--output-length", 1, "--json"))
    assert (traced[2]["reused_tokens"], single[2]["reused_tokens"]) == (0, 4)


def test_an_unlimited_engine_reuses_what_kvcli_s_chunk_rule_gives_on_every_sample():
    # one request at a time, blocks enough for everything: the engine's figure is the run of whole blocks within
    # the prompt's first n - 1 tokens, which is replay's except for prompts seen whole that end on a block boundary
    for name in ("chat_shared_system.jsonl", "bailian_handmade.jsonl", "tokens_small.jsonl"):
        engine = per_request(run("explain", SAMPLES / name, "--chunk-size", 16, "--gpu-blocks", 100_000, "--json"))
        for r in engine:
            b = r["best_prefix_tokens"]
            assert r["reused_tokens"] == min(b, r["prompt_tokens"] - 1) // 16 * 16, r["id"]


def test_the_engine_is_reported(tmp_path):
    trace = write(tmp_path / "t.jsonl", [A, A + [9]])
    out = run("explain", trace, "--chunk-size", 4, "--gpu-blocks", 10, "--max-num-seqs", 2, "--at-once", "--json")
    (body,) = json.loads(out.stdout)["traces"]
    assert body["engine"] == {"num_gpu_blocks": 10, "block_size": 4, "max_num_seqs": 2, "max_num_batched_tokens": 2048,
                              "step_seconds": 0.02, "prefill_tokens_per_second": 10000.0, "at_once": True,
                              "output_tokens": "trace", "preemptions": 0, "pinned_hit_tokens": 8}
    text = run("explain", trace, "--chunk-size", 4, "--gpu-blocks", 10).stdout
    assert "vLLM engine of 10 GPU blocks" in " ".join(text.split())  # wrapped where the temp path's length puts it


@pytest.mark.parametrize(("args", "message"), [
    (["--max-num-seqs", 2], "--max-num-seqs shapes the engine of --gpu-blocks: give --gpu-blocks too"),
    (["--at-once"], "--at-once shapes the engine"),
    (["--output-length", 3], "--output-length says what the engine of --gpu-blocks generates"),
    (["--gpu-blocks", 10, "--capacity-tokens", 100], "give it without --capacity-tokens, --capacity-bytes and --ttl"),
    (["--gpu-blocks", 10, "--ttl", 5], "vLLM expires nothing"),
    (["--gpu-blocks", 1], "--gpu-blocks must be >= 2 .block 0 is vLLM's null block"),
    (["--gpu-blocks", 10, "--output-length", "x"], "--output-length must be trace or an integer >= 1"),
    (["--gpu-blocks", 10, "--namespace", "ns"], "it reads no --namespace beside"),
    (["--gpu-blocks", 2], "t.jsonl:1: 8 prompt and 1 output tokens need 2 blocks of 4, but 2 GPU blocks hold 1 "),
])
def test_engine_options_are_checked(tmp_path, args, message):
    trace = write(tmp_path / "t.jsonl", [A])
    out = run("explain", trace, "--chunk-size", 4, *args, code=2)
    assert re.search(message, out.stderr), out.stderr


VALUES = st.sampled_from(["-1", "0", "1", "2", "3", "64", "1e3", "x", "2.5", "nan"])


def _valid_int(text: str, least: int) -> bool:
    try:
        return int(text) >= least
    except ValueError:
        return False


def _valid_float(text: str, positive: bool) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and (value > 0 if positive else value >= 0)


@settings(max_examples=60, deadline=None)
@given(blocks=VALUES, seqs=VALUES, batched=VALUES, output=st.sampled_from(["trace", "0", "1", "5", "x", "-2"]),
       step=VALUES, rate=VALUES)
def test_engine_option_values_end_in_exit_0_or_one_line(tmp_path_factory, blocks, seqs, batched, output, step,
                                                        rate):
    trace = write(tmp_path_factory.mktemp("t") / "t.jsonl", [A, A + [9]])
    out = CliRunner().invoke(app, ["explain", str(trace), "--chunk-size", "4", "--gpu-blocks", blocks,
                                   "--max-num-seqs", seqs, "--max-num-batched-tokens", batched,
                                   "--output-length", output, "--step-seconds", step,
                                   "--prefill-tokens-per-second", rate, "--json"])
    assert out.exit_code in (0, 2) and "Traceback" not in out.output, out.output
    valid = (_valid_int(blocks, 4) and _valid_int(seqs, 1) and _valid_int(batched, 1)
             and (output == "trace" or _valid_int(output, 1)) and _valid_float(step, False)
             and _valid_float(rate, True))
    if valid and output not in ("trace", "1") and int(output) + 8 > (int(blocks) - 1) * 4:
        valid = False  # the longest request's tokens do not fit the pool's KV blocks
    assert (out.exit_code == 0) == valid, (out.exit_code, out.stderr)


@pytest.mark.parametrize("config", [
    {"engine": EngineConfig(10, 8)},
    {"engine": EngineConfig(10, 4), "capacity_chunks": 5},
    {"output_tokens": 0},
])
def test_the_config_refuses_what_the_engine_cannot_be(config):
    with pytest.raises(BadInputError):
        ExplainConfig(4, **config)


def test_replay_approximates_the_engine_with_an_lru_of_n_minus_2_chunks(redis_url):
    # every prompt of the chat sample ends inside a 32-token block: one request at a time with one output token, the
    # engine's pool of N blocks holds what an LRU of N - 2 chunks holds, so replay's hits are the engine's
    trace = SAMPLES / "chat_shared_system.jsonl"
    engine = json.loads(run("explain", trace, "--chunk-size", 32, "--gpu-blocks", 40, "--output-length", 1,
                            "--json").stdout)["traces"][0]
    assert all(r["prompt_tokens"] % 32 for r in engine["per_request"])
    out = run("replay", trace, "--chunk-sizes", 32, "--gpu-blocks", 40, "--measure", 0, "--prefill-tps", 1000,
              "--payload", "accounted", "--no-curve", "--json", "--redis-url", redis_url)
    (row,) = json.loads(out.stdout)["traces"][0]["per_chunk_size"]
    assert row["hit_tokens"] == engine["reused_tokens"] and engine["lost_tokens_by_cause"]["eviction"] > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--chunk-sizes", "16,32", "--gpu-blocks", 10], "give one --chunk-size, its block size"),
    (["--chunk-sizes", 32, "--gpu-blocks", 10, "--capacity-tokens", 64], "without --capacity-tokens"),
    (["--chunk-sizes", 32, "--gpu-blocks", 2], "--gpu-blocks must be >= 3 here"),
])
def test_replay_checks_gpu_blocks(args, message):
    out = run("replay", SAMPLES / "tokens_small.jsonl", *args, "--measure", 0, "--prefill-tps", 1000, code=2)
    assert message in out.stderr, out.stderr
