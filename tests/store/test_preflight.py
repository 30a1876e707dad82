"""kvcli.store.preflight: what a full server does, judged from its policy and its keys' TTLs, on private servers."""
from __future__ import annotations

from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.store.preflight import evicts_when_full, preflight, server_memory

TRACE = Path(__file__).resolve().parents[2] / "sample_traces/mooncake_conversation_head1000.jsonl.gz"


@pytest.mark.parametrize("policy, expiring, writes_ttl, evicts", [
    ("noeviction", 5, True, False),
    ("allkeys-lru", 0, False, True),
    ("volatile-lru", 0, False, False),   # nothing carries a TTL: nothing to evict
    ("volatile-ttl", 0, False, False),
    ("volatile-lru", 1, False, True),
    ("volatile-lfu", 0, True, True),     # the run's own keys will carry one
    ("volatile-random", None, False, True),  # not known: assume the worst
])
def test_which_policies_evict_when_full(policy, expiring, writes_ttl, evicts):
    assert evicts_when_full(policy, expiring, writes_ttl) is evicts


def _full_server(make_server, policy: str) -> redis.Redis:
    client = redis.Redis.from_url(make_server(**{"maxmemory-policy": policy}))
    client.mset({f"theirs:{i}": b"x" * 100 for i in range(50)})  # other people's keys, none with a TTL
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 100_000)
    return client


def test_volatile_policy_without_a_ttl_refuses_writes_as_noeviction_does(make_server):
    client = _full_server(make_server, "volatile-lru")
    assert server_memory(client).expiring_keys == 0
    check = preflight(client, 10_000_000)
    assert check.fits is False and not check.evicts
    assert check.message.endswith("does not fit; writes will stop at the first out-of-memory reply, as under "
                                  "noeviction: volatile-lru evicts only keys with a TTL, and no key here has one")
    assert preflight(client, 10_000_000, writes_ttl=True).evicts  # warm --ttl: its own chunks are evictable
    client.expire("theirs:7", 3600)
    assert server_memory(client).expiring_keys == 1
    again = preflight(client, 10_000_000)
    assert again.evicts and "the server will evict keys" in again.message
    noeviction = preflight(_full_server(make_server, "noeviction"), 10_000_000)
    assert not noeviction.evicts and noeviction.message.endswith("writes will stop at the first out-of-memory reply")


def test_replay_on_a_volatile_server_without_ttls_is_not_refused_for_evictions(make_server):
    client = _full_server(make_server, "volatile-lru")
    url = client.connection_pool.connection_kwargs
    args = ["replay", str(TRACE), "--chunk-sizes", "16", "--limit", "100", "--measure", "0", "--prefill-tps",
            "1000", "--payload", "accounted", "--redis-url", f"redis://{url['host']}:{url['port']}"]
    out = CliRunner().invoke(app, args)
    assert "--allow-evictions" not in out.stderr and "Traceback" not in out.output
    assert out.exit_code == 3 and "maxmemory" in out.stderr, out.output  # the server refused a write: out of memory
    assert client.info("stats")["evicted_keys"] == 0
    assert sorted(client.scan_iter("*")) == sorted(f"theirs:{i}".encode() for i in range(50))
