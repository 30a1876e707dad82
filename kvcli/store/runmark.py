"""The server a run started on, and the check that a reconnected client still reaches it with the run's keys.

A replay's stores reconnect by themselves when a connection drops (:mod:`kvcli.store.server`). The server at the
other end may have restarted meanwhile (empty, or from an older snapshot) or been replaced (a failover): a replay
that went on would count misses where its own chunks were lost, and exit 0 with hits understated. So a run records
the server's ``INFO server`` ``run_id`` at its start (:func:`mark_run`) and writes a sentinel key in its own
namespace (:func:`write_sentinel`); after any dropped connection or timeout, :mod:`kvcli.store.calls` checks both
(:func:`check_run`) before the run goes on, and a different ``run_id`` or a missing sentinel stops the run with
:class:`ServerRestarted` (exit 3).

The sentinel is named like one of the run's payload keys (:data:`SENTINEL_HEX` where a chunk's hash goes), so the
deletion of the run's namespace by a SCAN (:func:`kvcli.store.namespace.purge_own`, ``kvcli purge``) removes it with
the rest; the run's own cleanup from its record of what it wrote (:mod:`kvcli.store.written`) names it
(:func:`kvcli.store.kvstore.purge_run`'s ``keys``). No lookup reads it (a payload is read only where its chunk's
metadata names it). Where ``INFO`` is refused (an ACL) or on a Redis Cluster (one ``run_id`` per primary), the
sentinel alone is checked.
"""
from __future__ import annotations

from dataclasses import dataclass

import redis

from kvcli.errors import RedisFailure
from kvcli.store.cluster import REDIS_ERRORS, is_cluster
from kvcli.store.layout import key_prefix
from kvcli.store.noreply import raise_no_reply
from kvcli.store.server import address, server_info

SENTINEL_HEX = "0" * 32  # the sentinel's "hash": no chunk's (a prefix hash of 128 zero bits)
SENTINEL_VALUE = b"kvcli run sentinel"


#: How a run's sentinel key ends (a payload key whose hash is :data:`SENTINEL_HEX`): ``key.endswith(SENTINEL_TAIL)``
#: tells it from a chunk's key, so the store's memory leaves it out.
SENTINEL_TAIL = ("p:" + SENTINEL_HEX).encode()


class ServerRestarted(RedisFailure):
    """The server a run reconnected to is not the one it started on, or lost the run's keys. Exit code 3."""


@dataclass(frozen=True)
class RunMark:
    """What identifies a run's server: its ``run_id`` at the start (None: not readable), the sentinel key the run
    writes, and the server's address (no password) for messages."""

    run_id: str | None
    sentinel: str
    where: str


def mark_run(client, namespace: str, chunk_size: int) -> RunMark:
    """The :class:`RunMark` of a run in ``namespace`` (its sentinel under ``chunk_size``, one of the run's), with the
    server's ``run_id`` read now; writes nothing (:func:`write_sentinel` does).

    Raises:
        NoReply: INFO got no reply (within the timeout, or the connection kept dropping).
        RedisFailure: INFO failed otherwise (other than refused).
    """
    info = None if is_cluster(client) else server_info(client, "server")
    run_id = str(info["run_id"]) if info and info.get("run_id") else None
    return RunMark(run_id, key_prefix(namespace, chunk_size) + "p:" + SENTINEL_HEX, address(client))


def write_sentinel(client, mark: RunMark) -> None:
    """Write the run's sentinel key.

    Raises:
        NoReply: no reply within the timeout, or the connection kept dropping (the same SET may be sent again).
        RedisFailure: the server refused it.
    """
    try:
        client.set(mark.sentinel, SENTINEL_VALUE)
    except REDIS_ERRORS as exc:
        raise_no_reply(exc, "SET", f"Redis SET failed: {exc}")


def delete_sentinel(client, mark: RunMark) -> None:
    """Delete the run's sentinel key (a run that keeps its namespace, ``--keep``, keeps its chunks alone).

    Raises:
        NoReply: no reply within the timeout, or the connection kept dropping (the same DEL may be sent again).
        RedisFailure: the server refused it.
    """
    try:
        client.delete(mark.sentinel)
    except REDIS_ERRORS as exc:
        raise_no_reply(exc, "DEL", f"Redis DEL failed: {exc}")


def check_run(client, mark: RunMark) -> None:
    """Check that ``client`` reaches the run's server with the run's keys: the same ``run_id`` (when one was read)
    and the sentinel present. Two round trips.

    Raises:
        ServerRestarted: another ``run_id``, or no sentinel.
        redis.RedisError: the check itself failed (connection, timeout): the caller tries again later.
    """
    if mark.run_id is not None:
        try:
            now = client.info("server").get("run_id")
        except redis.exceptions.ResponseError:  # refused now (an ACL changed): the sentinel decides
            now = mark.run_id
        if now is not None and str(now) != mark.run_id:
            raise ServerRestarted(f"the Redis server at {mark.where} restarted during the replay (INFO run_id "
                                  f"changed), so its data may be gone and hits after it would be understated; "
                                  f"the replay stopped")
    if not client.exists(mark.sentinel):
        raise ServerRestarted(f"the Redis server at {mark.where} lost this replay's keys during the run (its "
                              f"sentinel key {mark.sentinel} is gone: restarted empty, flushed or failed over), so "
                              f"hits after it would be understated; the replay stopped")
