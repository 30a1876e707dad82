"""Every command with --model takes a checkpoint folder, and uses its own tokenizer unless --tokenizer says
otherwise: replay end to end on a real Redis, warm then inspect, route."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.model.hf_offline import transformers
from kvcli.model.load import resolve_spec
from kvcli.model.tokenize import get_tokenizer

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly and accurately."}
Q1 = {"role": "user", "content": "What does a KV cache store?"}
A1 = {"role": "assistant", "content": "The keys and values of every token seen so far."}
Q2 = {"role": "user", "content": "And prefix caching?"}
Q3 = {"role": "user", "content": "Pack my box with five dozen liquor jugs."}
#: request 1; request 2 extends its conversation; request 3 repeats request 1; request 4 shares only the system.
CONVERSATIONS = [[SYSTEM, Q1], [SYSTEM, Q1, A1, Q2], [SYSTEM, Q1], [SYSTEM, Q3]]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_replay_end_to_end_with_the_checkpoints_tokenizer(tmp_path, redis_url, tiny_checkpoint):
    reference = transformers().AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    prompts = [list(reference.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False))
               for m in CONVERSATIONS]
    trace = tmp_path / "chat.jsonl"
    trace.write_text("".join(json.dumps({"id": f"r{i}", "messages": m}) + "\n" for i, m in enumerate(CONVERSATIONS)))
    out = CliRunner().invoke(app, ["replay", str(trace), "--model", tiny_checkpoint, "--chunk-sizes", "4,8",
                                   "--measure", "all", "--json", "--redis-url", redis_url])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    context, (result,) = doc["context"], doc["traces"]
    assert context["model_id"] == resolve_spec(tiny_checkpoint).model_id and context["checkpoint"] == tiny_checkpoint
    assert context["tokenizer"] == get_tokenizer(tiny_checkpoint).name and context["kv_bytes_per_token"] == 512
    assert result["requests"] == 4 and result["measured_requests"] == 4
    # The template makes request 2 extend request 1 and request 3 repeat it (a fact of this template, checked):
    assert prompts[1][:len(prompts[0])] == prompts[0] and prompts[2] == prompts[0]
    for row in result["per_chunk_size"]:
        c = row["chunk_size"]
        # Request k hits the full chunks of its longest token prefix shared with an earlier request (all full
        # chunks of earlier requests are stored; none is evicted).
        expected = [c * (max((common_prefix(p, q) for q in prompts[:k]), default=0) // c)
                    for k, p in enumerate(prompts)]
        assert expected[1] == expected[2] == c * (len(prompts[0]) // c) and expected[3] > 0
        assert row["hit_tokens"] == sum(expected)
        assert row["prompt_tokens"] == sum(map(len, prompts))
        assert row["max_logit_diff"] <= 1e-5  # cached vs full prefill, fp32, through the DynamicCache path


def test_warm_then_inspect_a_prompt_with_a_checkpoint(tmp_path, redis_url, tiny_checkpoint):
    prompts = tmp_path / "system.txt"
    prompts.write_text("You are a helpful assistant. Answer briefly and accurately.\n")
    runner = CliRunner()
    warm = runner.invoke(app, ["warm", str(prompts), "--model", tiny_checkpoint, "--chunk-size", "4",
                               "--redis-url", redis_url, "--json"])
    assert warm.exit_code == 0, warm.output
    n = len(get_tokenizer(tiny_checkpoint).encode_prompt(prompts.read_text().rstrip("\n")))  # BOS + text
    assert json.loads(warm.stdout)["totals"]["chunks_written"] == n // 4
    look = runner.invoke(app, ["inspect", "--prompt", prompts.read_text().rstrip("\n"), "--model", tiny_checkpoint,
                               "--chunk-size", "4", "--json", "--redis-url", redis_url])
    assert look.exit_code == 0, look.output
    (m,) = json.loads(look.stdout)["chunk_maps"]
    assert (m["hit_tokens"], m["prefill_tokens"]) == (n // 4 * 4, n % 4)
    assert m["model_id"] == resolve_spec(tiny_checkpoint).model_id
    other = runner.invoke(app, ["inspect", "--prompt", prompts.read_text().rstrip("\n"), "--model", tiny_checkpoint,
                                "--tokenizer", "cl100k_base", "--chunk-size", "4", "--json", "--redis-url",
                                redis_url])
    # another tokenizer: no chunk
    assert other.exit_code == 0 and json.loads(other.stdout)["chunk_maps"][0]["hit_tokens"] == 0


def test_route_takes_a_checkpoint_for_byte_capacities(tmp_path, tiny_checkpoint):
    trace = tmp_path / "chat.jsonl"
    trace.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    out = CliRunner().invoke(app, ["route", str(trace), "--model", tiny_checkpoint, "--prefill-tps", "1000",
                                   "--node-capacity", "1MB", "--policy", "round-robin", "--chunk-size", "4",
                                   "--rate", "1", "--no-count-rtt", "--json"])
    assert out.exit_code == 0, out.output
    (run,) = json.loads(out.stdout)["traces"][0]["runs"]
    assert run["config"]["capacity_tokens"] == 1_000_000 // 512  # 512 KV bytes per token from config.json


@pytest.mark.parametrize("command", ["replay", "warm", "route"])
def test_a_missing_checkpoint_folder_is_exit_2(tmp_path, redis_url, command):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"token_ids": [1, 2, 3]}) + "\n")
    args = [command, str(trace), "--model", str(tmp_path / "no-such-model")]
    args += ["--prefill-tps", "1000"] if command == "route" else ["--redis-url", redis_url]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2, out.output
    assert "no such checkpoint folder" in out.stderr and "Traceback" not in out.output


@pytest.mark.parametrize("arch, dtype, bytes_per_token, bound", [
    ("deepseek_v3", "bfloat16", 192, 5e-2),  # 2 layers x (latent 32 + RoPE key 16) x 2 B
    ("gpt_oss", "float32", 512, 1e-5),       # 2 layers x 2 x 2 KV heads x 16 x 4 B; window 8, sinks
])
def test_replay_end_to_end_with_other_architectures(tmp_path, redis_url, arch, dtype, bytes_per_token, bound):
    from kvcli.model.hf_tiny import write_tiny_checkpoint

    folder = str(write_tiny_checkpoint(tmp_path / arch, vocab=512, dtype=dtype, arch=arch))
    trace = tmp_path / "chat.jsonl"
    trace.write_text("".join(json.dumps({"id": f"r{i}", "messages": m}) + "\n" for i, m in enumerate(CONVERSATIONS)))
    out = CliRunner().invoke(app, ["replay", str(trace), "--model", folder, "--chunk-sizes", "4",
                                   "--measure", "all", "--json", "--redis-url", redis_url])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    (row,) = doc["traces"][0]["per_chunk_size"]
    assert doc["context"]["kv_bytes_per_token"] == bytes_per_token
    assert row["hit_tokens"] > 0 and row["max_logit_diff"] <= bound


def test_a_config_only_preset_prices_a_replay_without_weights(tmp_path, redis_url):
    trace = tmp_path / "chat.jsonl"
    trace.write_text("".join(json.dumps({"id": f"r{i}", "messages": m}) + "\n" for i, m in enumerate(CONVERSATIONS)))
    args = ["replay", str(trace), "--model", "deepseek-v3", "--chunk-sizes", "4", "--json", "--redis-url", redis_url,
            "--measure", "0"]
    out = CliRunner().invoke(app, args + ["--payload", "accounted", "--prefill-tps", "5000"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["context"]["kv_bytes_per_token"] == 61 * 576 * 2
    # reading the config (transformers' import and config classes: seconds) is a phase of its own
    phases = [line.split("] ", 1)[1] for line in out.stderr.splitlines() if line.startswith("[")]
    assert phases[:3] == [f"connecting to Redis at {redis_url}", "reading the model's config: deepseek-v3",
                          f"trace 1 of 1: {trace}"]
    real = CliRunner().invoke(app, args)  # real payload bytes need the model's KV: one line, no traceback
    assert real.exit_code != 0 and "no weights" in real.output and "Traceback" not in real.output
