"""kvcli purge against a real (embedded) Redis server: only one namespace's kvcli keys go, everything else stays."""
from __future__ import annotations

import json
import time

import pytest
import redis
from test_warm import cli_app
from typer.testing import CliRunner

from kvcli.errors import BadInputError
from kvcli.store import cluster
from kvcli.store.namespace import count, purge, purge_own

H = "0123456789abcdef0123456789abcdef"


def key(namespace: str, chunk_size: int, kind: str, n: int) -> str:
    return f"kvcli:v1:{namespace}:{chunk_size}:{kind}:{H[:-2]}{n:02x}"


@pytest.fixture
def filled(redis_client):
    """Namespace "a" (chunk sizes 4 and 8: 3 chunks each, metadata + payload), look-alikes, foreign keys."""
    mine = [key("a", cs, kind, n) for cs in (4, 8) for kind in "mp" for n in range(3)]
    others = [key("b", 4, "m", 0), key("b", 4, "p", 0),            # another namespace
              key("a:b", 4, "m", 0), key("a:b", 4, "p", 0),        # a namespace that starts with "a:"
              key("a*", 4, "m", 0), key("[a]", 4, "m", 0),         # glob characters in namespaces
              "kvcli:v1:a:4:calibration:0", "kvcli:v1:a:notes",   # kvcli's prefix, not a chunk key
              "a", "app:session:1", "kvcli", "kvcli:v2:a:4:m:" + H]
    for k in mine + others:
        redis_client.set(k, b"v")
    redis_client.expire("app:session:1", 3600)
    return mine, others


def test_count_is_read_only_and_exact(redis_client, filled):
    redis_client.config_resetstat()
    found = count(redis_client, "a")
    assert (found.metadata, found.payloads, found.keys, found.by_chunk_size) == (6, 6, 12, {4: 6, 8: 6})
    ran = {k.removeprefix("cmdstat_") for k in redis_client.info("commandstats")}
    assert ran <= {"scan", "info", "config|resetstat", "cluster|info"}  # CLUSTER INFO: is every slot served?
    assert redis_client.dbsize() == 12 + len(filled[1])


def test_purge_deletes_one_namespace_and_nothing_else(redis_client, filled):
    mine, others = filled
    redis_client.config_resetstat()
    done = purge(redis_client, "a")
    assert (done.keys, done.deleted) == (12, 12)
    assert not any(redis_client.exists(k) for k in mine)
    assert all(redis_client.get(k) == b"v" for k in others)
    assert 0 < redis_client.ttl("app:session:1") <= 3600
    ran = {k.removeprefix("cmdstat_") for k in redis_client.info("commandstats")}
    assert "unlink" in ran and not ran & {"flushdb", "flushall", "keys", "del"}


def test_purge_one_chunk_size(redis_client, filled):
    mine, _ = filled
    done = purge(redis_client, "a", chunk_size=4)
    assert (done.deleted, done.by_chunk_size) == (6, {4: 6})
    assert [k for k in mine if redis_client.exists(k)] == [k for k in mine if ":8:" in k]


def test_glob_characters_in_namespace_match_literally(redis_client, filled):
    assert purge(redis_client, "a*").deleted == 1
    assert redis_client.exists(key("a", 4, "m", 0)) and redis_client.exists(key("[a]", 4, "m", 0))
    assert purge(redis_client, "[a]").deleted == 1 and redis_client.exists(key("a", 8, "p", 2))


def test_a_key_holding_a_newline_is_one_key_not_two_chunks(redis_client, filled):
    odd = key("a", 4, "m", 7) + "\n" + key("a", 4, "p", 7)  # its two lines each look like a chunk key of "a"
    redis_client.set(odd, b"v")
    assert count(redis_client, "a").keys == 12
    assert purge(redis_client, "a").deleted == 12 and redis_client.get(odd) == b"v"


def test_empty_namespace_is_refused(redis_client):
    with pytest.raises(BadInputError):
        purge(redis_client, "")


def test_cli_purge_needs_yes_and_shows_the_count_first(redis_url, redis_client, filled):
    runner = CliRunner()
    res = runner.invoke(cli_app(), ["purge", "--namespace", "a", "--redis-url", redis_url])
    assert res.exit_code == 2
    assert "12 kvcli keys in namespace 'a' (6 metadata, 6 payloads)" in res.stderr and "--yes" in res.stderr
    assert redis_client.dbsize() == 12 + len(filled[1])
    res = runner.invoke(cli_app(), ["purge", "--namespace", "a", "--chunk-size", "8", "--yes", "--json",
                                    "--redis-url", redis_url])
    assert res.exit_code == 0, res.output
    assert "6 kvcli keys" in res.stderr
    assert json.loads(res.stdout)["deleted"] == 6 and redis_client.dbsize() == 6 + len(filled[1])
    res = runner.invoke(cli_app(), ["purge", "--redis-url", redis_url])
    assert res.exit_code == 2  # --namespace is required


def test_cli_prints_namespaces_with_markup_characters_as_they_are(redis_url, redis_client):
    redis_client.set(key("[/]", 16, "m", 0), b"v")
    redis_client.set(key("[p]", 16, "p", 0), b"v")
    runner = CliRunner()
    res = runner.invoke(cli_app(), ["purge", "--namespace", "[/]", "--redis-url", redis_url])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("1 kvcli keys in namespace '[/]' (1 metadata, 0 payloads)")
    res = runner.invoke(cli_app(), ["purge", "--namespace", "[p]", "--redis-url", redis_url])
    assert res.exit_code == 2 and res.stderr.startswith("1 kvcli keys in namespace '[p]' (0 metadata, 1 payloads)")
    res = runner.invoke(cli_app(), ["purge", "--namespace", "[/]", "--yes", "--redis-url", redis_url])
    assert res.exit_code == 0, res.output
    assert res.stdout == "deleted 1 keys of namespace '[/]'\n"
    assert redis_client.exists(key("[p]", 16, "p", 0)) and not redis_client.exists(key("[/]", 16, "m", 0))


def test_purge_leaves_look_alike_keys_kvcli_never_writes(redis_client, filled):
    """Keys that match the SCAN pattern but not kvcli's layout: a chunk size with a leading zero, chunk size 0, a
    hash under a chunk key's name, a list under one. kvcli writes none of them; purge and count leave them."""
    mine, others = filled
    look_alikes = [key("a", 4, "m", 0).replace(":4:", ":04:"), key("a", 4, "p", 1).replace(":4:", ":0:")]
    for k in look_alikes:
        redis_client.set(k, b"v")
    typed = [key("a", 16, "m", 0), key("a", 16, "p", 0)]
    redis_client.hset(typed[0], "f", "v")
    redis_client.rpush(typed[1], "v")
    assert count(redis_client, "a").keys == 12
    assert purge(redis_client, "a").deleted == 12
    assert all(redis_client.exists(k) for k in look_alikes + typed + others)
    assert not any(redis_client.exists(k) for k in mine)


def test_layout_parse_key_refuses_look_alike_chunk_sizes():
    from kvcli.store.layout import parse_key

    assert parse_key(key("a", 4, "m", 0).encode()).chunk_size == 4
    assert parse_key(key("a", 4, "m", 0).replace(":4:", ":04:").encode()) is None
    assert parse_key(key("a", 4, "m", 0).replace(":4:", ":0:").encode()) is None


def test_purge_own_deletes_the_namespace_inside_the_server_and_nothing_else(redis_client, filled):
    """A replay's cleanup of its own namespace: SCAN + UNLINK in one script per step on a single server (no key
    travels), purge() on a cluster: the same keys either way, look-alikes and other namespaces left alone."""
    mine, others = filled
    look_alikes = [key("a", 4, "m", 0).replace(":4:", ":04:")[:-1], key("a", 4, "q", 1)]  # 31 hex digits; kind q
    for k in look_alikes:
        redis_client.set(k, b"v")
    redis_client.rpush(key("a", 16, "m", 0), "v")  # not a string
    redis_client.config_resetstat()
    assert purge_own(redis_client, "a") == 12
    assert not any(redis_client.exists(k) for k in mine)
    assert all(redis_client.exists(k) for k in others + look_alikes + [key("a", 16, "m", 0)])
    ran = {k.removeprefix("cmdstat_") for k in redis_client.info("commandstats")}
    assert not ran & {"flushdb", "flushall", "keys", "del"}
    assert ("evalsha" in ran or "eval" in ran) != cluster.is_cluster(redis_client)  # the script: single server only
    assert purge_own(redis_client, "a*") == 1 and redis_client.exists(key("[a]", 4, "m", 0))


@pytest.mark.single_server("an ACL on one server")
def test_purge_own_falls_back_to_the_client_side_purge_without_scripts(make_server):
    url = make_server()
    admin = redis.Redis.from_url(url)
    for n in range(5):
        admin.set(key("run", 8, "m", n), b"v")
    admin.set(key("other", 8, "m", 0), b"v")
    admin.acl_setuser("noscript", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-@scripting"])
    user = redis.Redis.from_url(url.replace("redis://", "redis://noscript:pw@"))
    assert purge_own(user, "run") == 5 and admin.dbsize() == 1


@pytest.mark.single_server("one server's script blocks it")
def test_purge_own_waits_out_another_clients_long_script(make_server):
    """While another client's script holds the server, its steps get BUSY: they are sent again until it ends."""
    import threading

    url = make_server()
    admin = redis.Redis.from_url(url)
    admin.config_set("busy-reply-threshold", 100)  # ms: BUSY for others once a script runs longer than this
    for n in range(7):
        admin.set(key("run", 8, "m", n), b"v")
    admin.set(key("other", 8, "m", 0), b"v")
    spin = "local t = redis.call('TIME') repeat until tonumber(redis.call('TIME')[1]) > tonumber(t[1]) + 1"
    busy = threading.Thread(target=lambda: redis.Redis.from_url(url, socket_timeout=30).eval(spin, 0))
    busy.start()
    time.sleep(0.4)  # the script is past the threshold: other commands get BUSY
    with pytest.raises(redis.exceptions.ResponseError, match="^BUSY"):
        admin.dbsize()
    assert purge_own(redis.Redis.from_url(url), "run") == 7
    busy.join()
    assert admin.dbsize() == 1
