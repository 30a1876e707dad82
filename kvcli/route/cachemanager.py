"""The KV cache manager: a real Redis index of chunk hash -> nodes holding it, and the delay of asking it.

The notes' second design: the router asks a cache-management service which node holds the longest reusable
prefix. Here that service is a Redis (or Valkey) server:

* Layout: one set per chunk, key ``kvcli:v1:kvcli-route:route:{<run>}:`` + the 16-byte hash in hex
  (:func:`kvcli.store.layout.route_index_prefix`), members the node numbers as decimal strings (``b"0"``,
  ``b"1"``...). ``<run>`` is random per index, so runs never see each other's keys. Every key carries a TTL of
  :data:`~kvcli.store.layout.ROUTE_INDEX_TTL_SECONDS` (an hour), set with each SADD and set again on all of the
  index's keys every third of it, so an index whose run was killed is gone within the hour; ``kvcli purge
  --namespace kvcli-route --yes`` deletes it at once, and ``kvcli inspect`` counts it as route index keys.
* Redis Cluster: ``{<run>}`` is a hash tag, so every key of one index hashes to ONE slot: the query script's KEYS
  (all of a request's chunks) must share a slot, and a per-chunk-set index has no smaller unit that a script can
  walk alone. The cost: one index lives on one shard (its memory and its queries are that shard's; a simulation's
  index is a few MB). The alternative, a set per serving node tagged by node (``{<run>:<node>}``, members the
  chunks it holds), spreads an index over up to one shard per node but needs one script per node and query (one
  round trip per shard); kvcli keeps the one-slot layout, whose query stays one command on one shard.
* Writes (nodes, :meth:`CacheManagerIndex.publish`): after a prefill a node SADDs itself to the chunks it newly
  cached and SREMs itself from the ones it evicted, in one pipelined round trip.
* Reads (router, :meth:`CacheManagerIndex.query`): ONE round trip per request, whatever its chunk count: an
  EVALSHA of a small Lua script that walks the chunks in order, keeps the nodes that hold every chunk so far
  (SMEMBERS on chunk 0, then SMISMEMBER of the survivors), stops at the first chunk no survivor holds, and
  returns each node's depth (leading chunks held).

The injected delay (:class:`DelaySpec`) models a slow manager: fixed, or lognormal given its median and p99.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import redis

from kvcli.errors import BadInputError, RedisFailure
from kvcli.store import cluster
from kvcli.store.layout import ROUTE_INDEX_TTL_SECONDS, route_index_prefix
from kvcli.units import parse_duration

_Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile
@dataclass(frozen=True)
class DelaySpec:
    """An injected lookup delay: ``fixed`` at ``median_s``, or ``lognormal`` with median ``median_s`` and 99th
    percentile ``p99_s`` (so ``sigma = ln(p99/median) / z_0.99``, ``mu = ln(median)``).

    Text form (:meth:`parse`): ``"0"``, ``"5ms"``, ``"fixed:5ms"``, ``"lognormal:1ms:40ms"`` (median, p99).
    """

    kind: str = "fixed"
    median_s: float = 0.0
    p99_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "lognormal"):
            raise BadInputError(f"unknown delay kind {self.kind!r}; valid: fixed, lognormal")
        if not (math.isfinite(self.median_s) and math.isfinite(self.p99_s)):
            raise BadInputError("a lookup delay must be a finite number of seconds")
        if self.median_s < 0 or (self.kind == "lognormal" and not 0 < self.median_s <= self.p99_s):
            raise BadInputError("a lookup delay needs 0 <= fixed delay, or 0 < median <= p99 for lognormal")

    @classmethod
    def parse(cls, text: str) -> DelaySpec:
        """Parse the text form above. Raises BadInputError."""
        parts = str(text).strip().split(":")
        if parts[0] == "lognormal" and len(parts) == 3:
            return cls("lognormal", parse_duration(parts[1]), parse_duration(parts[2]))
        if parts[0] == "fixed" and len(parts) == 2:
            parts = parts[1:]
        if len(parts) != 1:
            raise BadInputError(f"bad lookup delay {text!r}; use 5ms, fixed:5ms or lognormal:MEDIAN:P99")
        value = parse_duration(parts[0])
        return cls("fixed", value, value)

    def sample(self, rng) -> float:
        """One delay in seconds (``rng``: a numpy Generator; unused for a fixed delay)."""
        if self.kind == "fixed":
            return self.median_s
        sigma = math.log(self.p99_s / self.median_s) / _Z99
        return float(rng.lognormal(math.log(self.median_s), sigma))

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"{self.median_s * 1e3:g}ms"
        return f"lognormal:{self.median_s * 1e3:g}ms:{self.p99_s * 1e3:g}ms"


# KEYS: the request's chunk keys in order. Returns a flat array node, depth, node, depth... for depth >= 1.
_QUERY_LUA = """
local out = {}
local alive = redis.call('SMEMBERS', KEYS[1])
if #alive == 0 then return out end
for i = 2, #KEYS do
  local held = redis.call('SMISMEMBER', KEYS[i], unpack(alive))
  local keep = {}
  for j, node in ipairs(alive) do
    if held[j] == 1 then keep[#keep + 1] = node else out[#out + 1] = node; out[#out + 1] = i - 1 end
  end
  alive = keep
  if #alive == 0 then return out end
end
for _, node in ipairs(alive) do out[#out + 1] = node; out[#out + 1] = #KEYS end
return out
"""


class CacheManagerIndex:
    """The Redis index chunk hash -> nodes of one simulation (see the module docstring for the layout).

    Args:
        client: a redis-py client (e.g. from :func:`kvcli.store.server.open_redis`).
        nodes: number of nodes (depth lists have this length).

    Raises:
        RedisFailure: any Redis error, here or in a later call (wrapped, with the command that failed).
    """

    def __init__(self, client: redis.Redis, nodes: int) -> None:
        self.client, self.nodes = client, nodes
        self.prefix = route_index_prefix(os.urandom(6).hex())  # a hash tag: one slot per index
        self.queries = self.writes = 0
        self._sha = self._call("SCRIPT LOAD", client.script_load, _QUERY_LUA)
        self._refresh_at = time.monotonic() + ROUTE_INDEX_TTL_SECONDS / 3

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except cluster.REDIS_ERRORS as exc:
            raise RedisFailure(f"cache manager {what} failed: {exc}") from None

    def publish(self, node: int, stored, evicted) -> None:
        """Node ``node`` newly cached ``stored`` and evicted ``evicted`` (chunk hashes): one pipelined round trip."""
        if not stored and not evicted:
            return
        if time.monotonic() >= self._refresh_at:
            self._refresh()
        pipe, member, prefix = self.client.pipeline(transaction=False), str(node), self.prefix
        for h in stored:
            key = prefix + h.hex().encode()
            pipe.sadd(key, member)
            pipe.expire(key, ROUTE_INDEX_TTL_SECONDS)
        for h in evicted:
            pipe.srem(prefix + h.hex().encode(), member)
        self._call("publish", pipe.execute)
        self.writes += 1

    def _refresh(self) -> None:
        """Set every key's TTL again (SCAN of the index, EXPIRE pipelined): a chunk no node stored for a third of
        the TTL is still indexed while the run lasts."""
        for _, keys in cluster.scan(self.client, self.prefix + b"*", 1000):
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.expire(key, ROUTE_INDEX_TTL_SECONDS)
            self._call("refresh", pipe.execute)
        self._refresh_at = time.monotonic() + ROUTE_INDEX_TTL_SECONDS / 3

    def query(self, hashes) -> tuple[list[int], float]:
        """Leading chunks of ``hashes`` held by each node, in ONE round trip (EVALSHA).

        Returns:
            (depths ``[nodes]``, measured seconds of the round trip, ``time.perf_counter``).
        """
        depths = [0] * self.nodes
        if not hashes:
            return depths, 0.0
        keys = [self.prefix + h.hex().encode() for h in hashes]
        start = time.perf_counter()
        flat = self._call("query", self.client.evalsha, self._sha, len(keys), *keys)
        seconds = time.perf_counter() - start
        self.queries += 1
        for k in range(0, len(flat), 2):
            depths[int(flat[k])] = int(flat[k + 1])
        return depths, seconds

    def drop(self) -> int:
        """Delete this index's keys (SCAN of every primary + UNLINK of each batch of up to 1,000: one slot, so one
        command), on fresh connections: the simulation may have been interrupted (Ctrl-C, SIGTERM) between a
        pipeline's send and its last reply, and a pooled connection's unread reply would answer the SCAN. Returns
        the number deleted."""
        cluster.drop_connections(self.client)
        deleted = 0
        for _, keys in cluster.scan(self.client, self.prefix + b"*", 1000):
            for start in range(0, len(keys), 1000):
                deleted += self._call("unlink", cluster.unlink, self.client, keys[start:start + 1000])
        return deleted
