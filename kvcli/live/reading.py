"""Read-only access to a live server shared by inspect and the chunk map: a NO-TOUCH reader connection, read
pipelines and one SCAN step's key facts. Whether a chunk can be used is :mod:`kvcli.store.judge`'s; the server's
memory facts are :mod:`kvcli.store.preflight` (replay uses them too).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import redis
from redis.cluster import RedisCluster

from kvcli.errors import RedisFailure
from kvcli.store import cluster
from kvcli.store.server import no_touch_client

READ_COMMANDS = frozenset({"scan", "mget", "get", "exists", "strlen", "pttl", "memory|usage", "info", "dbsize",
                           "eval_ro", "client|no-touch",
                           # a Redis Cluster: the slot map and command table redis-py's cluster client reads when
                           # it connects, and CLUSTER INFO (kvcli.store.cluster.check_whole)
                           "cluster|info", "cluster|slots", "cluster|shards", "command"})


# PTTL, STRLEN (and MEMORY USAGE when ARGV[1] is "1") of every key, in one EVAL_RO: the server refuses any write
# inside it, and one command per SCAN step instead of two or three per key is 4-5x faster (bench/bench_inspect.py).
# STRLEN of a key that holds no string (WRONGTYPE) is -1.
KEY_FACTS = """local o = {}
for _, k in ipairs(KEYS) do
  o[#o + 1] = redis.call('PTTL', k)
  local n = redis.pcall('STRLEN', k)
  if type(n) == 'table' then n = -1 end
  o[#o + 1] = n
  if ARGV[1] == '1' then o[#o + 1] = redis.call('MEMORY', 'USAGE', k) or false end
end
return o"""


@contextlib.contextmanager
def reader(client: redis.Redis | RedisCluster) -> Iterator[redis.Redis | RedisCluster]:
    """A client for inspect's reads: ONE connection to ``client``'s server (to each primary of a cluster; a pool of
    one, so every command and pipeline goes over it; a second connection would be an error, not a silent bypass;
    made by :func:`kvcli.store.server.no_touch_client`), in ``CLIENT NO-TOUCH ON`` mode from its first command on
    (sent again after a reconnect), so reads leave the keys' LRU/LFU state as it was. Servers without NO-TOUCH
    (Redis < 7.2) or an ACL that refuses it: the error is ignored and the reads touch keys as any client's reads
    do. ``.kvcli_no_touch`` on the yielded client says whether every server accepted it (None until connected). A
    client from :func:`reader` is yielded as is. Closed on exit."""
    if getattr(client, "kvcli_no_touch", False) is not False:
        yield client
        return

    state: dict = {"no_touch": None, "client": None}  # a cluster client connects while it is being made

    def on_connect(conn) -> None:
        try:
            conn.send_command("CLIENT", "NO-TOUCH", "ON")
            conn.read_response()
            state["no_touch"] = state["no_touch"] is not False
        except redis.ResponseError:  # unknown subcommand (Redis < 7.2) or refused by an ACL
            state["no_touch"] = False
        if state["client"] is not None:
            state["client"].kvcli_no_touch = state["no_touch"]

    ours: Any = no_touch_client(client, on_connect)  # a Redis or a RedisCluster, with kvcli_no_touch set here
    state["client"] = ours
    ours.kvcli_no_touch = state["no_touch"]
    try:
        yield ours
    finally:
        ours.close()
        if not cluster.is_cluster(ours):
            ours.connection_pool.disconnect()


def execute_read(pipe, raise_on_error: bool = True):
    """Run a read pipeline; a Redis error becomes RedisFailure (one line at the CLI)."""
    try:
        return pipe.execute(raise_on_error=raise_on_error)
    except cluster.REDIS_ERRORS as exc:
        raise RedisFailure(f"Redis read failed: {exc}") from None


def read_key_facts(client, keys: list[bytes], metas: list[bytes], with_memory: bool,
                   script: list[bool]) -> tuple[list, list]:
    """One round trip for one SCAN step's keys (on a cluster one per shard: per-key commands in redis-py's cluster
    pipeline, GET instead of MGET): MGET of ``metas`` (the metadata-named keys among ``keys``) and
    each key's PTTL, STRLEN (and MEMORY USAGE) in one EVAL_RO of :data:`KEY_FACTS`, or pipelined one command per
    key where scripts are refused (``script[0]`` is set False then, for the next steps too).

    Returns ``(metadata values, facts)``: the MGET's values in ``metas`` order, and ``facts`` flat, ``2 +
    with_memory`` per key in ``keys`` order (STRLEN of a key that holds no string is negative or an error).

    Raises:
        RedisFailure: the read failed.
    """
    per_key = cluster.is_cluster(client)  # a cluster: no multi-key command or script across slots
    if per_key:
        script[0] = False
    pipe = client.pipeline(transaction=False)
    if metas and per_key:
        for key in metas:
            pipe.get(key)
    elif metas:
        pipe.mget(metas)
    if script[0]:
        pipe.execute_command("EVAL_RO", KEY_FACTS, len(keys), *keys, "1" if with_memory else "0")
    else:
        for key in keys:
            pipe.pttl(key)
            pipe.strlen(key)
            if with_memory:
                pipe.memory_usage(key)
    replies = execute_read(pipe, raise_on_error=False)
    if script[0] and isinstance(replies[-1], redis.ResponseError):
        script[0] = False  # no EVAL_RO (Redis < 7, scripting disabled, ACL): per-key commands from now on
        return read_key_facts(client, keys, metas, with_memory, script)
    got = len(metas) if per_key else int(bool(metas))
    if per_key:  # GET of a key of another type: WRONGTYPE, where MGET answers nil
        replies[:got] = [None if isinstance(r, redis.ResponseError) and "WRONGTYPE" in str(r) else r
                         for r in replies[:got]]
    if any(isinstance(r, Exception) for r in replies[:got + script[0]]):
        raise RedisFailure(f"Redis read failed: {next(r for r in replies if isinstance(r, Exception))}")
    values = list(replies[:got]) if per_key else (list(replies[0]) if metas else [])
    return values, (replies[-1] if script[0] else replies[got:])
