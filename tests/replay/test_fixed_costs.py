"""What an index-only replay leaves out when nothing uses it: the transfer calibration (a priced replay prices
every overhead from counts; ``--link-gbps`` prices the wire), the sampled unpipelined lookups (a priced replay
prices lookups too) and, for a large trace file, the pass that checks it before the replay (it is checked as the
replay reads it)."""
from __future__ import annotations

import json

import pytest
import redis
import torch
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.replay import replayer
from kvcli.replay.measure import calibrate_transfer
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.records import StoreConfig

# three copies of one 40-token prompt at chunk size 16: 2 full chunks each, the 2nd and 3rd hit both (32 tokens
# each, 64 in all); 2 chunks written
TRACE = "".join(json.dumps({"token_ids": list(range(1, 41)), "timestamp": t}) + "\n" for t in range(3))


@pytest.mark.single_server("commandstats of one server")
def test_a_priced_replay_times_no_transfer_and_samples_no_lookup(tmp_path, redis_url):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    client = redis.Redis.from_url(redis_url)
    client.config_resetstat()
    out = CliRunner().invoke(app, ["replay", str(trace), "--payload", "accounted", "--measure", "0",
                                   "--prefill-tps", "5000", "--chunk-sizes", "16", "--redis-url", redis_url,
                                   "--json", "--jobs", "1"])
    assert out.exit_code == 0, out.output
    (row,) = json.loads(out.stdout)["traces"][0]["per_chunk_size"]
    assert (row["hit_tokens"], row["objects_created"], row["lookups_sampled"]) == (64, 2, 0)
    stats = client.info("commandstats")
    # no probe written or read (SET, MGET), no unpipelined lookup (EVAL_RO): the batch script (EVAL), the run's
    # sentinel and the cleanup
    assert not {"cmdstat_mget", "cmdstat_eval_ro", "cmdstat_evalsha_ro"} & set(stats)
    assert stats["cmdstat_set"]["calls"] == 1  # the sentinel (kvcli.store.runmark), no probe


def test_calibrating_without_the_wire_writes_nothing(redis_client):
    """With a network model for the transfers, the calibration times (de)serialization on this machine only."""
    store = ChunkStore(redis_client, StoreConfig("cal", 16, "m", "raw", (2, 2, 2, 32), torch.float32))
    before = redis_client.dbsize()
    rates = calibrate_transfer(redis_client, store, wire=False)
    assert redis_client.dbsize() == before and store.written.chunks("p") == 0
    assert (rates.set_seconds, rates.get_seconds, rates.wire) == (0.0, 0.0, False)
    assert rates.serialize_seconds > 0 and rates.deserialize_seconds > 0 and len(rates.spread) == 6


def _run(tmp_path, redis_url, text: str, *args: str):
    trace = tmp_path / "t.jsonl"
    trace.write_text(text)
    return CliRunner().invoke(app, ["replay", str(trace), "--payload", "accounted", "--measure", "0",
                                    "--prefill-tps", "5000", "--chunk-sizes", "16", "--redis-url", redis_url,
                                    "--json", *args])


def _figures(out) -> list:
    assert out.exit_code == 0, out.output
    (t,) = json.loads(out.stdout)["traces"]
    return [t["requests"], t["notes"][0]] + [
        (r["hit_tokens"], r["upper_bound_tokens"], r["objects_created"], r["metadata_bytes_written"])
        for r in t["per_chunk_size"]]


@pytest.mark.single_server("the keys left on one server")
@pytest.mark.parametrize("jobs", [[], ["--jobs", "1"]], ids=["read ahead", "read here"])
@pytest.mark.parametrize("stamps", [(0, 1, 1, 2, 5), (0, 3, 1, 2, 5), (0, None, 1, 2, 5)],
                         ids=["ordered", "unordered", "untimed"])
def test_a_trace_checked_as_it_is_read_replays_as_one_outlined_first(tmp_path, redis_url, monkeypatch, jobs,
                                                                     stamps):
    """Every trace file read once (STREAM_BYTES 0): the same figures and notes as when it is outlined first, also
    when it turns out not to be in arrival order (replayed again, ordered) or a request has no time (file order);
    nothing left on the server. Prompts of 40 tokens sharing their first 16 with each other: the 2nd to 5th hit 1
    chunk each in any order (64 hit tokens), 1 + 4 distinct second chunks written, 6 objects."""
    text = "".join(json.dumps({"token_ids": [1] * 16 + [i + 2] * 24, **({} if t is None else {"timestamp": t})})
                   + "\n" for i, t in enumerate(stamps))
    outlined = _figures(_run(tmp_path, redis_url, text, *jobs))
    monkeypatch.setattr(replayer, "STREAM_BYTES", 0)
    streamed = _run(tmp_path, redis_url, text, *jobs)
    assert _figures(streamed) == outlined
    assert outlined[2][:3] == (64, 64, 6)
    assert redis.Redis.from_url(redis_url).dbsize() == 0


@pytest.mark.single_server("the keys left on one server")
def test_a_bad_record_of_a_trace_checked_as_it_is_read_ends_the_run_in_one_line(tmp_path, redis_url, monkeypatch):
    monkeypatch.setattr(replayer, "STREAM_BYTES", 0)
    good = json.dumps({"token_ids": list(range(1, 41))}) + "\n"
    out = _run(tmp_path, redis_url, good * 600 + '{"token_ids": "x"}\n' + good)
    assert out.exit_code == 2
    assert "t.jsonl:601" in out.stderr.strip().splitlines()[-1] and "Traceback" not in out.output
    assert redis.Redis.from_url(redis_url).dbsize() == 0  # what the run wrote before it was deleted
