"""What an index-only replay leaves out when nothing uses it: the transfer calibration (a priced replay prices
every overhead from counts; ``--link-gbps`` prices the wire) and the sampled unpipelined lookups (a priced
replay prices lookups too)."""
from __future__ import annotations

import json

import pytest
import redis
import torch
from typer.testing import CliRunner

from kvcli.cli.app import app
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
