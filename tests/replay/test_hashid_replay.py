"""Hash-id traces replayed on a private Redis server: hit tokens and spans computed by hand."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from typer.testing import CliRunner

from kvcli.cli.app import app

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces/mooncake_conversation_head1000.jsonl.gz"


def replay_json(redis_url, *args) -> dict:
    """--jobs 1: this process alone (worker processes start in seconds, and give the same report: test_parallel)."""
    out = CliRunner().invoke(app, ["replay", *map(str, args), "--measure", "0", "--prefill-tps", "1000",
                                   "--payload", "accounted", "--no-curve", "--json", "--redis-url", redis_url,
                                   "--jobs", "1"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def hits(trace: dict) -> dict[int, int]:
    return {r["chunk_size"]: r["hit_tokens"] for r in trace["per_chunk_size"]}


def test_two_bailian_records_sharing_one_block(tmp_path, redis_url):
    """Records [1,2,3] (40 tokens, t=10 s) and [1,9,10,11,12] (70 tokens, t=20 s) share block 1 only: at chunk 16
    the second request hits 16 tokens; at 32 its first chunk is blocks 1+9, new; the span is 20 - 10 = 10 s."""
    trace = tmp_path / "bailian.jsonl"
    trace.write_text(
        '{"chat_id": 1, "parent_chat_id": -1, "timestamp": 10.0, "input_length": 40, "output_length": 5, '
        '"type": "text", "turn": 1, "hash_ids": [1, 2, 3]}\n'
        '{"chat_id": 2, "parent_chat_id": 1, "timestamp": 20.0, "input_length": 70, "output_length": 5, '
        '"type": "text", "turn": 2, "hash_ids": [1, 9, 10, 11, 12]}\n')
    (result,) = replay_json(redis_url, trace, "--chunk-sizes", "16,32")["traces"]
    assert hits(result) == {16: 16, 32: 0}
    assert result["span_seconds"] == 10.0
    assert ("read as a bailian hash-id trace: 16 tokens per hash id (the format's), timestamps in s "
            "(the format's), sessions: the root of each parent_chat_id chain") in result["notes"]


def test_a_hash_id_record_s_cache_salt_keeps_tenants_apart(tmp_path, redis_url):
    """The same 3 blocks of 16 tokens (48) four times: tenant a, tenant b (a miss: another salt), a again (hits
    all but the last token: 47), no salt (a miss). Hit tokens 47 of 192 at chunk 16, and the upper bound agrees."""
    rows = [{"block_size": 16, "input_length": 48, "hash_ids": [1, 2, 3], **({"cache_salt": salt} if salt else {})}
            for salt in ("a", "b", "a", None)]
    trace = tmp_path / "salted.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (result,) = replay_json(redis_url, trace, "--chunk-sizes", "16")["traces"]
    (row,) = result["per_chunk_size"]
    assert (row["hit_tokens"], row["prompt_tokens"], row["upper_bound_tokens"]) == (47, 192, 47)
    trace.write_text(json.dumps(dict(rows[0], cache_salt=7)) + "\n")
    out = CliRunner().invoke(app, ["replay", str(trace), "--measure", "0", "--prefill-tps", "1000", "--redis-url",
                                   redis_url])
    assert out.exit_code == 2 and f"{trace}:1: cache_salt must be a string, not a number" in out.output


def test_a_bad_bailian_record_is_exit_2_naming_file_and_line(tmp_path, redis_url):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"chat_id": 1, "parent_chat_id": -1, "timestamp": 1, "input_length": 40, "hash_ids": [1]}\n')
    out = CliRunner().invoke(app, ["replay", str(trace), "--measure", "0", "--prefill-tps", "1000",
                                   "--payload", "accounted", "--redis-url", redis_url])
    assert out.exit_code == 2
    assert out.stderr.strip().splitlines()[-1] == (f"kvcli: error: {trace}:1: 1 hash_ids for input_length 40 at "
                                                   "16 tokens per id: expected ceil(40/16) = 3")


def reexpress(record: dict, block: int) -> dict:
    """A Mooncake record at ``block``-token ids in seconds: id h's k-th sub-block is h * (512 // block) + k."""
    per = 512 // block
    n = -(-record["input_length"] // block)
    ids = [h * per + k for h in record["hash_ids"] for k in range(per)][:n]
    return {"timestamp": record["timestamp"] / 1000, "input_length": record["input_length"],
            "output_length": record["output_length"], "hash_ids": ids}


def test_mooncake_reexpressed_at_16_token_ids_in_seconds_hits_the_same(tmp_path, redis_url):
    records = [json.loads(line) for line in gzip.open(SAMPLE, "rt")][:60]
    original = tmp_path / "mooncake.jsonl"
    original.write_text("".join(json.dumps(r) + "\n" for r in records))
    sixteen = tmp_path / "sixteen.jsonl"
    sixteen.write_text("".join(json.dumps(reexpress(r, 16)) + "\n" for r in records))
    sizes = ["--chunk-sizes", "64,256,512"]
    (before,) = replay_json(redis_url, original, *sizes)["traces"]
    (after,) = replay_json(redis_url, sixteen, *sizes, "--hash-block-tokens", "16", "--timestamp-unit", "s")["traces"]
    assert hits(after) == hits(before)
    assert hits(before)[512] > 0 and after["span_seconds"] == before["span_seconds"]
    assert before["span_seconds"] == (records[-1]["timestamp"] - records[0]["timestamp"]) / 1000
