"""Before writing to a server that may not be ours: its memory state, an estimate of what a run will add, and the
verdict (fits, or would make the server evict keys, maybe other people's). Shared by ``kvcli warm`` and
``kvcli replay``; both also report the server's ``evicted_keys`` delta over the run.

Estimate of Redis memory per key: the value rounded up to jemalloc's size class, plus the key's bytes and ~64 bytes
of bookkeeping (dict entry, robj, expiry slot). It is a plan, not a measurement: ``MEMORY USAGE`` sampled after
the run (the replay report's "Redis memory" row) is the measured figure.
"""
from __future__ import annotations

from dataclasses import dataclass

import redis
from redis.cluster import RedisCluster

from kvcli.errors import RedisFailure
from kvcli.store import cluster
from kvcli.store.noreply import raise_no_reply
from kvcli.store.server import INFO_REFUSED, server_info
from kvcli.units import fmt_bytes

#: Bytes of server bookkeeping per key besides the key string and the value (dict entry, robj header, sds).
KEY_OVERHEAD_BYTES = 64
#: Length of a chunk key's variable part: one-letter kind, ':' and the 32 hex digits of the hash (layout.py).
CHUNK_KEY_TAIL = 34


@dataclass(frozen=True)
class MemoryFigures:
    """Memory state and counters read from INFO and DBSIZE: bytes; ``policy`` is maxmemory-policy; ``keys`` is
    DBSIZE; ``expiring_keys`` the keys that carry a TTL (INFO keyspace ``expires``, every database); None where
    this user may not read them."""

    used_memory: int | None
    maxmemory: int | None
    policy: str | None
    evicted_keys: int | None
    expired_keys: int | None
    keys: int | None
    expiring_keys: int | None
    version: str


@dataclass(frozen=True)
class ShardMemory(MemoryFigures):
    """One primary's :class:`MemoryFigures`, ``name`` "host:port"."""

    name: str


@dataclass(frozen=True)
class ServerMemory(MemoryFigures):
    """The server's :class:`MemoryFigures`. On a Redis Cluster the totals over its primaries (``maxmemory`` 0, no
    limit, when any primary has none; ``policy`` and ``version`` "mixed" when they differ), and ``shards`` each
    primary's own (empty for a single server).

    When this Redis user may not run INFO (an ACL without ``@dangerous``), every INFO field is None, ``version``
    is "?" and ``note`` says why; DBSIZE is None too when refused. Callers degrade: no preflight, no eviction count.
    """

    note: str = ""
    shards: tuple[ShardMemory, ...] = ()

    @property
    def known(self) -> bool:
        """Whether INFO was read."""
        return self.used_memory is not None

    def to_dict(self) -> dict:
        """JSON-ready; ``shards`` a list of each primary's figures (empty for a single server)."""
        return {**self.__dict__, "shards": [s.__dict__ for s in self.shards]}


def server_memory(client) -> ServerMemory:
    """INFO memory/stats/server and DBSIZE, read-only, of the server or of every primary of a cluster (summed:
    :class:`ServerMemory`); a user refused INFO (or DBSIZE) gets None fields and a note.

    Raises:
        NoReply: INFO or DBSIZE got no reply within the timeout, or the connection kept dropping.
        RedisFailure: any other error.
    """
    facts = [_shard_memory(name, node) for name, node in cluster.shards(client)]
    first = facts[0]
    keys = None if any(f.keys is None for f in facts) else sum(f.keys or 0 for f in facts)
    if first.used_memory is None:
        return ServerMemory(None, None, None, None, None, keys, None, "?",
                            note=f"server memory and counters not read: {INFO_REFUSED}")
    policies, versions = {f.policy for f in facts}, {f.version for f in facts}
    return ServerMemory(sum(f.used_memory or 0 for f in facts),
                        0 if any(not f.maxmemory for f in facts) else sum(f.maxmemory or 0 for f in facts),
                        first.policy if len(policies) == 1 else "mixed", sum(f.evicted_keys or 0 for f in facts),
                        sum(f.expired_keys or 0 for f in facts), keys, sum(f.expiring_keys or 0 for f in facts),
                        first.version if len(versions) == 1 else "mixed",
                        shards=tuple(facts) if cluster.is_cluster(client) else ())


def _shard_memory(name: str, client: redis.Redis) -> ShardMemory:
    info = server_info(client, "memory", "stats", "server", "keyspace")
    try:
        keys = int(client.dbsize())
    except redis.exceptions.NoPermissionError:
        keys = None
    except redis.RedisError as exc:
        raise_no_reply(exc, "DBSIZE", f"Redis DBSIZE failed on {name}: {exc}")
    if info is None:
        return ShardMemory(None, None, None, None, None, keys, None, "?", name=name)
    expiring = sum(int(db.get("expires", 0)) for name_, db in info.items()
                   if name_.startswith("db") and name_[2:].isdigit() and isinstance(db, dict))
    return ShardMemory(int(info.get("used_memory", 0)), int(info.get("maxmemory", 0)),
                       str(info.get("maxmemory_policy", "?")), int(info.get("evicted_keys", 0)),
                       int(info.get("expired_keys", 0)), keys, expiring,
                       str(info.get("valkey_version") or info.get("redis_version", "?")), name=name)


def evicts_when_full(policy: str | None, expiring_keys: int | None, writes_ttl: bool = False) -> bool:
    """Whether a server over maxmemory makes room by evicting keys (else it refuses writes with an out-of-memory
    error): every policy but ``noeviction``, except a ``volatile-*`` policy when no key on the server carries a TTL
    (``expiring_keys`` 0) and the run writes none (``writes_ttl`` False): such a policy evicts only keys with a TTL,
    so it has nothing to evict and acts as ``noeviction`` does."""
    if policy == "noeviction":
        return False
    return not (policy is not None and policy.startswith("volatile-") and expiring_keys == 0 and not writes_ttl)


def full_server(policy: str | None, evicts: bool, who: str = "the server") -> str:
    """What a server (``who``) over maxmemory does, in words, for a preflight message (``evicts``:
    :func:`evicts_when_full`)."""
    if evicts:
        return f"{who} will evict keys (maybe other data, maybe these chunks)"
    if policy == "noeviction":
        return "writes will stop at the first out-of-memory reply"
    return (f"writes will stop at the first out-of-memory reply, as under noeviction: {policy} evicts only keys "
            f"with a TTL, and no key here has one")


def alloc_size(n: int) -> int:
    """jemalloc's size class for ``n`` bytes (16-byte steps to 128, then 4 classes per power of two)."""
    if n <= 128:
        return max(8, -(-n // 16) * 16)
    step = 1 << (n.bit_length() - 3)
    return -(-n // step) * step


def keys_bytes(keys: int, key_length: int, value_bytes: int) -> int:
    """Estimated Redis memory of ``keys`` keys of ``key_length`` bytes each holding ``value_bytes`` (bytes)."""
    if keys <= 0:
        return 0
    return keys * (alloc_size(value_bytes) + key_length + KEY_OVERHEAD_BYTES)


@dataclass(frozen=True)
class Preflight:
    """The estimate against the server's memory (bytes). ``fits`` is None when the server has no maxmemory or this
    user may not read it (INFO refused: ``used_memory``, ``maxmemory`` and ``policy`` None, the check skipped).

    ``evicts``: the run would push the server over maxmemory under a policy that evicts keys
    (:func:`evicts_when_full`: any policy but noeviction, and a volatile-* one only when some key has a TTL): other
    keys on the server, or the run's own, may be evicted. ``policy_evicts``: that policy judgement alone.
    """

    estimate_bytes: int
    used_memory: int | None
    maxmemory: int | None
    policy: str | None
    fits: bool | None
    message: str
    evicted_keys_before: int | None = 0
    policy_evicts: bool = True

    @property
    def evicts(self) -> bool:
        """True when the estimate does not fit and the policy evicts keys to make room."""
        return self.fits is False and self.policy_evicts

    def to_dict(self) -> dict:
        """JSON-ready, with unit-suffixed names."""
        return {"estimate_bytes": self.estimate_bytes, "used_memory_bytes": self.used_memory,
                "maxmemory_bytes": self.maxmemory, "policy": self.policy, "fits": self.fits,
                "message": self.message}


def preflight(client: redis.Redis | RedisCluster, need_bytes: int | None, mem: ServerMemory | None = None,
              writes_ttl: bool = False) -> Preflight:
    """Compare ``need_bytes`` (from :func:`keys_bytes`) with ``maxmemory - used_memory``.

    Args:
        client: the server (read with INFO when ``mem`` is None).
        need_bytes: estimated Redis memory the run adds; None when not estimated (a caller may skip the estimate
            on a server without maxmemory: there is nothing to compare it with).
        mem: the server's state, read just before.
        writes_ttl: the run's keys carry a TTL (``warm --ttl``): a volatile-* policy may evict them.

    Raises:
        RedisFailure: INFO failed.
    """
    mem = mem or server_memory(client)
    if not mem.known:
        estimate = "" if need_bytes is None else f"{fmt_bytes(need_bytes)} of Redis memory estimated; "
        return Preflight(need_bytes or 0, None, None, None, None,
                         f"{estimate}skipped the check against maxmemory: {INFO_REFUSED}", None)
    if mem.shards and any(sh.maxmemory for sh in mem.shards):
        return _cluster_preflight(mem, need_bytes or 0, writes_ttl)
    assert mem.maxmemory is not None and mem.used_memory is not None  # known: INFO was read
    free = mem.maxmemory - mem.used_memory
    if not mem.maxmemory:
        where = (f"used_memory {fmt_bytes(mem.used_memory)}" if need_bytes is None else
                 f"{fmt_bytes(need_bytes)} of Redis memory estimated; used_memory {fmt_bytes(mem.used_memory)}")
        return Preflight(need_bytes or 0, mem.used_memory, 0, mem.policy, None, f"{where}, no maxmemory set",
                         mem.evicted_keys)
    need_bytes = need_bytes or 0
    where = f"{fmt_bytes(need_bytes)} of Redis memory estimated; used_memory {fmt_bytes(mem.used_memory)}"
    fits = need_bytes <= free
    evicts = evicts_when_full(mem.policy, mem.expiring_keys, writes_ttl)
    message = f"{where}, maxmemory {fmt_bytes(mem.maxmemory)} ({mem.policy})"
    if not fits:
        message += f": does not fit; {full_server(mem.policy, evicts)}"
    return Preflight(need_bytes, mem.used_memory, mem.maxmemory, mem.policy, fits, message, mem.evicted_keys,
                     evicts)


def _cluster_preflight(mem: ServerMemory, need_bytes: int, writes_ttl: bool) -> Preflight:
    """A cluster's check, shard by shard: the keys spread evenly over the primaries (their chunk hashes pick the
    slots), so each primary gets ``need_bytes / primaries``; it fits when every primary with a maxmemory has that
    much room. The first primary that would not fit decides the policy reported (one that evicts wins), so a run
    that would make any shard evict is refused as on a single server."""
    share = need_bytes / len(mem.shards)
    short = [sh for sh in mem.shards if sh.maxmemory and share > sh.maxmemory - (sh.used_memory or 0)]
    evicts = {sh.name: evicts_when_full(sh.policy, sh.expiring_keys, writes_ttl) for sh in mem.shards}
    worst = next((sh for sh in short if evicts[sh.name]), short[0] if short else None)
    limits = ", ".join(f"{sh.name} {fmt_bytes(sh.maxmemory) if sh.maxmemory else 'none'}" for sh in mem.shards)
    message = (f"{fmt_bytes(need_bytes)} of Redis memory estimated, about {fmt_bytes(int(share))} per primary; "
               f"used_memory {fmt_bytes(mem.used_memory)} over {len(mem.shards)} primaries, maxmemory {limits}")
    if worst is not None:
        message += (f": does not fit on {worst.name} (used_memory {fmt_bytes(worst.used_memory)}, maxmemory "
                    f"{fmt_bytes(worst.maxmemory)}, {worst.policy}); "
                    + full_server(worst.policy, evicts[worst.name], "that shard"))
    policy = worst.policy if worst is not None else mem.policy
    return Preflight(need_bytes, mem.used_memory, sum(sh.maxmemory or 0 for sh in mem.shards), policy,
                     worst is None, message, mem.evicted_keys, worst is None or evicts[worst.name])


def evicted_since(client: redis.Redis | RedisCluster, before: Preflight | ServerMemory,
                  now: ServerMemory | None = None) -> int | None:
    """Keys the server evicted since ``before`` was read (INFO ``evicted_keys`` delta; whoever caused them), or
    None when the counter cannot be read (then, or now: INFO refused, or the server unreachable). ``now``: the
    server's memory read by the caller (a replay reads it under its rule on failed calls); None: read here once."""
    start = before.evicted_keys_before if isinstance(before, Preflight) else before.evicted_keys
    if now is None:
        try:
            now = server_memory(client)
        except RedisFailure:
            return None
    return None if start is None or now.evicted_keys is None else max(0, now.evicted_keys - start)
