"""A store's Redis calls: each one round trip, with its faults counted and the tolerant store's rule applied.

The client's connections retry a dropped connection themselves (redis-py's Retry, set up in
:mod:`kvcli.store.server`, which counts the retries and timeouts it saw in a :class:`~kvcli.store.server.
FaultCounts`). A call that still fails (the connection kept dropping, or no reply within the client's timeout)
raises :class:`RedisUnavailable`; in a tolerant store (replay's) the caller absorbs it by the documented rule
(:meth:`Calls.absorb`: a failed lookup is a miss and that request stores nothing, a failed retrieve returns no
KV, a failed store writes nothing more), until :data:`MAX_FAILURES_IN_ROW` calls in a row on the client have
failed: then the server is taken as gone and the error is raised anyway. Other errors (out of memory,
permissions) always raise, as :class:`~kvcli.errors.RedisFailure`.
"""
from __future__ import annotations

from collections.abc import Callable

import redis

from kvcli.errors import RedisFailure, redis_error_text
from kvcli.store.cluster import REDIS_ERRORS, ShardTrips, mget
from kvcli.store.records import StoreStats
from kvcli.store.server import FaultCounts, fault_counts

MAX_FAILURES_IN_ROW = 3  # calls failing after retries, in a row, before a tolerant store gives up


class RedisUnavailable(RedisFailure):
    """A call failed after redis-py's retries: the connection kept dropping, or no reply came within the timeout
    (``timeout`` True); ``final``: :data:`MAX_FAILURES_IN_ROW` was reached, never absorbed. Exit code 3."""

    def __init__(self, message: str, timeout: bool = False, final: bool = False) -> None:
        super().__init__(message)
        self.timeout, self.final = timeout, final


class Calls:
    """The Redis calls of one store on one client, counted in the store's :class:`~kvcli.store.records.
    StoreStats` (``round_trips``, ``redis_errors``, ``redis_retries``, ``redis_timeouts``) and, per shard, in
    :attr:`shard_trips`.

    Args:
        client: a redis-py client (a single server or a Redis Cluster).
        stats: the store's running totals, updated in place.
        tolerate_unavailable: whether the store absorbs a :class:`RedisUnavailable` (:meth:`absorb`).
    """

    def __init__(self, client: redis.Redis, stats: StoreStats, tolerate_unavailable: bool = False) -> None:
        self.client, self.stats, self.tolerate_unavailable = client, stats, tolerate_unavailable
        self.shard_trips = ShardTrips(client)  # round trips per shard: {"host:port": count}
        self._faults = fault_counts(client) or FaultCounts()

    def call(self, fn: Callable, *args, record: bool = True, name: str | None = None):
        """``fn(*args)`` as one round trip (counted in ``round_trips`` when ``record``); ``name`` is the command
        named in an error (default: ``fn``'s name, upper case).

        Raises:
            RedisUnavailable: the call failed after retries (``final`` once :data:`MAX_FAILURES_IN_ROW` calls in a
                row on this client have).
            RedisFailure: any other error of the server or the client.
        """
        self.stats.round_trips += record
        faults, st = self._faults, self.stats
        retries, timeouts = faults.retries, faults.timeouts
        try:
            result = fn(*args)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            faults.failed_in_row += 1
            st.redis_errors += 1
            timeout = isinstance(exc, redis.exceptions.TimeoutError)
            why = "no reply within the timeout" if timeout else "the connection kept dropping"
            if faults.failed_in_row >= MAX_FAILURES_IN_ROW:
                raise RedisUnavailable(f"the Redis server stopped answering: {faults.failed_in_row} calls in a row "
                                       f"failed after retries (last: {name or _name(fn)}, {why}: {exc})", timeout,
                                       final=True) from None
            raise RedisUnavailable(f"Redis {name or _name(fn)} failed after retries ({why}): {exc}", timeout) from None
        except REDIS_ERRORS as exc:
            raise RedisFailure(f"Redis {name or _name(fn)} failed: {redis_error_text(exc)}") from None
        finally:
            st.redis_retries += faults.retries - retries
            st.redis_timeouts += faults.timeouts - timeouts
        faults.failed_in_row = 0
        return result

    def read(self, keys: list[str], record: bool = True) -> list:
        """MGET of ``keys`` (one round trip per shard on a cluster: :func:`kvcli.store.cluster.mget`), counted per
        shard when ``record``. Raises as :meth:`call`."""
        return self.call(mget, self.client, keys, self.shard_trips if record else None, record=record)

    def absorb(self, exc: RedisUnavailable) -> None:
        """Re-raise ``exc`` unless this store absorbs it (a tolerant store, and not the last straw: module
        docstring); the caller then goes on by the rule."""
        if not self.tolerate_unavailable or exc.final:
            raise exc


def _name(fn) -> str:
    """The command a call is named by in errors: the function's name (or a partial's), without underscores."""
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None) or "command"
    return str(name).strip("_").upper()
