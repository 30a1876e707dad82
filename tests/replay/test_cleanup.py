"""A replay's cleanup on a given server deletes exactly the keys the run wrote, rebuilt from its stores' records of
them (kvcli.store.written): no SCAN, every key of others left, the same keys left as the SCAN cleanup
(kvcli.store.namespace.purge_own) leaves; where a record may be incomplete (a worker's part lost), the SCAN."""
from __future__ import annotations

from pathlib import Path

import pytest
import redis

from kvcli.errors import KvcliError, RedisFailure
from kvcli.replay.events import ReplayEvents
from kvcli.replay.results import ReplayConfig
from kvcli.replay.runner import ModelOptions, run_replay
from kvcli.store import kvstore, lmcache_store
from kvcli.store.namespace import purge_own, scan_keys
from kvcli.store.server import describe

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "sample_traces/mooncake_conversation_head1000.jsonl.gz"
INDEX_ONLY = ModelOptions("cpu", prefill_tps=1000.0)
# others' keys: plain ones, kvcli-layout keys of other namespaces (one named like a replay's), an LMCache-layout one
FOREIGN = {
    b"foreign": b"1",
    b"kvcli:v1:fleet:16:m:" + b"ab" * 16: b"meta",
    b"kvcli:v1:fleet:16:p:" + b"00" * 16: b"payload",
    b"kvcli:v1:replay-1-2-abcdef:16:m:" + b"cd" * 16: b"another run's",
    b"fleet/16/m@1@0@1f@bfloat16kv_bytes": b"lmcache",
}


def _foreign(client) -> None:
    for key, value in FOREIGN.items():
        client.set(key, value)


def _left(client) -> dict[bytes, bytes]:
    keys = [key for batch in scan_keys(client) for key in batch]
    return {key: client.get(key) for key in keys}


@pytest.fixture
def scans(monkeypatch) -> list[str]:
    """The SCAN cleanups called during the test, by name (they still run)."""
    called: list[str] = []

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            called.append(name)
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(kvstore, "purge_own", counted("purge_own", kvstore.purge_own))
    monkeypatch.setattr(lmcache_store, "purge_namespace", counted("purge_namespace", lmcache_store.purge_namespace))
    return called


def _replay(client, url: str, config: ReplayConfig, options: ModelOptions = INDEX_ONLY, events=None, jobs=1):
    results, _ = run_replay(client, describe(client, url, False), [MOONCAKE], config, options, events=events,
                            jobs=jobs)
    return results[0]


CASES = {
    "pipelined": dict(),
    "one-by-one": dict(pipeline=1),
    "capacity": dict(capacity_tokens=20_000),
    "lmcache": dict(layouts=("kvcli", "lmcache"), limit=10),  # its lookups are one round trip per chunk
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_cleanup_deletes_what_the_run_wrote_and_what_the_scan_deletes(redis_client, redis_url, scans, case):
    """The same replay twice: kept and deleted with today's SCAN (purge_own, and LMCache's purge_namespace), then
    deleted from its records: both leave exactly the foreign keys; the second scans nothing."""
    _foreign(redis_client)
    config = dict(chunk_sizes=(16, 64), payload="accounted", measure=0, limit=20) | CASES[case]
    kept = _replay(redis_client, redis_url, ReplayConfig(keep=True, **config))
    namespace = _namespace(kept)
    assert sum(len(batch) for batch in scan_keys(redis_client)) > len(FOREIGN) + 1000  # the kept run's keys
    purge_own(redis_client, namespace)
    if "lmcache" in config.get("layouts", ()):
        lmcache_store.purge_namespace(redis_client, namespace)
    assert _left(redis_client) == FOREIGN
    scans.clear()
    result = _replay(redis_client, redis_url, ReplayConfig(**config))
    assert _left(redis_client) == FOREIGN
    assert scans == []
    rows = {(r.layout, r.chunk_size): r for r in result.per_chunk_size + result.by_layout.get("lmcache", [])}
    assert rows[("kvcli", 16)].metadata_entries == kept.per_chunk_size[0].metadata_entries > 1000
    if case == "capacity":
        assert rows[("kvcli", 16)].evicted_chunks > 0


def _namespace(result) -> str:
    """The run's namespace, from a kept run's note (``namespace X kept (--keep)``)."""
    note = next(n for n in result.notes if n.startswith("namespace replay-"))
    return note.split()[1]


def test_a_measured_run_with_real_payloads_deletes_them_too(redis_client, redis_url, scans):
    _foreign(redis_client)
    config = ReplayConfig(chunk_sizes=(64,), payload="real", measure=2, limit=40, measure_max_tokens=256)
    result = _replay(redis_client, redis_url, config, ModelOptions("tiny", prefill_tps=1000.0))
    assert result.per_chunk_size[0].payload_bytes_written > 0
    assert _left(redis_client) == FOREIGN and scans == []


@pytest.mark.single_server("--jobs spawns workers on one server's URL; the cluster half is the same code")
def test_keys_written_by_worker_processes_are_deleted_from_their_records(redis_client, redis_url, scans):
    _foreign(redis_client)
    config = ReplayConfig(chunk_sizes=(16, 64), payload="accounted", measure=0, limit=120)
    result = _replay(redis_client, redis_url, config, jobs=2)
    assert result.per_chunk_size[0].metadata_entries > 1000
    assert _left(redis_client) == FOREIGN and scans == []


class _StopAt(ReplayEvents):
    def __init__(self, at: int) -> None:
        self.at = at

    def requests(self, trace: str, done: int, total: int) -> None:
        if done == self.at:
            raise KeyboardInterrupt


def test_an_interrupted_run_deletes_its_keys_from_its_records(redis_client, redis_url, scans):
    """Ctrl-C midway, a batch in flight: what was sent is recorded, so nothing is left."""
    _foreign(redis_client)
    config = ReplayConfig(chunk_sizes=(16, 64), payload="accounted", measure=0, limit=120, pipeline=32)
    with pytest.raises(KeyboardInterrupt):
        _replay(redis_client, redis_url, config, events=_StopAt(90))
    assert _left(redis_client) == FOREIGN and scans == []


@pytest.mark.single_server("maxmemory of one server")
def test_a_run_refused_midway_deletes_its_keys_from_its_records(make_server, scans):
    """The server refuses a write midway (OOM, noeviction): the run fails and its keys are deleted."""
    url = make_server()
    client = redis.Redis.from_url(url)
    _foreign(client)
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 2_000_000)
    # ~2 MB is ~20 requests: the second batch of 16 requests fails in its MSET, after the first one's writes
    config = ReplayConfig(chunk_sizes=(16,), payload="accounted", measure=0, limit=200, pipeline=16)
    with pytest.raises(RedisFailure, match="OOM command not allowed .*MSET"):
        _replay(client, url, config)
    assert _left(client) == FOREIGN and scans == []


class _LostPart:
    """Units whose one worker wrote its stores' keys and then died: its part, and its records, are lost."""

    waited = False  # whether the replay waited for its workers' connections to close (quiet)

    def run(self, replayer, work, progress):
        replayer.replay_unit(work, tuple(range(len(work.stores))), True)  # stores of its own, as a worker's
        raise KvcliError("a replay worker process died")

    def quiet(self, client) -> bool:
        """Its worker's connections are closed (it wrote through the test's own client)."""
        self.waited = True
        return True


def test_a_lost_record_falls_back_to_the_scan(redis_client, scans):
    from kvcli.model.costcurve import CostCurve
    from kvcli.model.presets import ModelSpec
    from kvcli.replay.replayer import Replayer
    from kvcli.replay.runner import TraceSource

    _foreign(redis_client)
    import torch

    config = ReplayConfig(chunk_sizes=(16, 64), payload="accounted", measure=0, limit=60)
    units = _LostPart()
    replayer = Replayer(redis_client, None, CostCurve.from_tokens_per_second(1000.0), "cl100k_base", config,
                        spec=ModelSpec("m", (2, 2, 2, 32), torch.float32), units=units)
    with pytest.raises(KvcliError, match="worker process died"):
        replayer.replay("t", TraceSource(MOONCAKE, "auto", "cl100k_base"))
    assert _left(redis_client) == FOREIGN
    assert scans == ["purge_own"] and units.waited  # the scan after the workers' connections closed


def test_purge_deletes_what_a_kept_lmcache_layout_replay_left_and_nothing_else(redis_client, redis_url):
    """replay --layout lmcache --keep names the command; purge --layout lmcache counts those keys, deletes them
    only with --yes, and leaves every foreign key (another model's LMCache key among them)."""
    import json

    from typer.testing import CliRunner

    from kvcli.cli.app import app

    _foreign(redis_client)
    out = CliRunner().invoke(app, ["replay", str(ROOT / "sample_traces/chat_shared_system.jsonl"), "--payload",
                                   "accounted", "--measure", "0", "--prefill-tps", "5000", "--chunk-sizes", "16",
                                   "--layout", "lmcache", "--keep", "--redis-url", redis_url, "--json"])
    assert out.exit_code == 0, out.output
    (note,) = [n for n in json.loads(out.stdout)["traces"][0]["notes"] if "kept (--keep)" in n]
    namespace = note.split()[1]
    assert f"kvcli purge --namespace {namespace} --layout lmcache --yes" in note
    kept = len(_left(redis_client)) - len(FOREIGN)
    assert kept > 100
    count = CliRunner().invoke(app, ["purge", "--namespace", namespace, "--layout", "lmcache", "--redis-url",
                                     redis_url])
    assert count.exit_code == 2 and f"{kept:,} LMCache keys in namespace {namespace!r} (LMCache layout)" in count.stderr
    assert len(_left(redis_client)) == len(FOREIGN) + kept
    done = CliRunner().invoke(app, ["purge", "--namespace", namespace, "--layout", "lmcache", "--yes",
                                    "--redis-url", redis_url, "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["deleted"] == kept
    assert _left(redis_client) == FOREIGN
