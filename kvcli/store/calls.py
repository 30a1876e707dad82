"""A store's Redis calls: each one round trip, with its faults counted and the tolerant store's rule applied.

The client's connections retry a dropped connection themselves (redis-py's Retry, set up in
:mod:`kvcli.store.server`, which counts the retries and timeouts it saw in a :class:`~kvcli.store.server.
FaultCounts`). A call that still fails (the connection kept dropping, or no reply within the client's timeout)
raises :class:`RedisUnavailable`; in a tolerant store (replay's) the caller absorbs it by the documented rule
(:meth:`Calls.absorb`: a failed lookup is a miss and that request stores nothing, a failed retrieve returns no
KV, a failed store writes nothing more), until :data:`MAX_FAILURES_IN_ROW` calls in a row on the client have
failed: then the server is taken as gone and the error is raised anyway. Other errors (out of memory,
permissions) always raise, as :class:`~kvcli.errors.RedisFailure`.

Two replies of a server that is busy with a script are not the end of a call:

* ``BUSY`` (another client's script runs past the server's ``busy-reply-threshold``; the command did not run): the
  call is sent again (:class:`~kvcli.store.busy.Backoff`) until the script ends, for up to the client's reply
  timeout (``--redis-timeout``) in all, each send counted in ``redis_busy_retries``; still BUSY then, the call has
  failed as a timeout would (:class:`RedisUnavailable`).
* "Script killed by user" (another client's ``SCRIPT KILL`` stopped a script of ours: a lookup, a batch): the call
  failed, as one that lost its connection does (:class:`ScriptKilled`, a :class:`RedisUnavailable` that does not
  count towards :data:`MAX_FAILURES_IN_ROW`: the server answers).

A store made with a :class:`~kvcli.store.runmark.RunMark` also checks, after any dropped connection or timeout on
its client, that the server is still the run's (:func:`~kvcli.store.runmark.check_run`) before the next call goes
on; when it is not, :class:`~kvcli.store.runmark.ServerRestarted` ends the run (exit 3). A check that gets no reply
is a failed call towards :data:`MAX_FAILURES_IN_ROW` like any other.

The replay's own calls beside its stores' (INFO and DBSIZE of the server's memory, CONFIG GET, the transfer
calibration, the sentinel's SET and DEL, the reads of each store's Redis memory, the UNLINKs of the cleanup) go
through :func:`resend`: one that gets no reply is a failed call towards the same count and is sent again (each
changes nothing, or the same thing again). Whichever call a stall lands on, fewer than :data:`MAX_FAILURES_IN_ROW`
reply timeouts in a row are absorbed and that many end the run.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.cluster import RedisCluster

from kvcli.errors import RedisFailure, redis_error_text
from kvcli.store.busy import Backoff, is_busy, is_script_killed
from kvcli.store.cluster import REDIS_ERRORS, ShardTrips, mget
from kvcli.store.noreply import NoReply, as_no_reply, no_reply
from kvcli.store.records import StoreStats
from kvcli.store.runmark import RunMark, check_run
from kvcli.store.server import DEFAULT_TIMEOUT, FaultCounts, fault_counts, reply_timeout

MAX_FAILURES_IN_ROW = 3  # calls failing after retries, in a row, before a tolerant store gives up

T = TypeVar("T")


class RedisUnavailable(RedisFailure):
    """A call failed after redis-py's retries: the connection kept dropping, or no reply came within the timeout
    (``timeout`` True); ``final``: :data:`MAX_FAILURES_IN_ROW` was reached, never absorbed. Exit code 3."""

    def __init__(self, message: str, timeout: bool = False, final: bool = False) -> None:
        super().__init__(message)
        self.timeout, self.final = timeout, final


class ScriptKilled(RedisUnavailable):
    """A script of ours was stopped by another client's ``SCRIPT KILL``: the call failed, the server answers."""


class ServerBusy(RedisFailure):
    """A BUSY reply to a call made with ``busy_retry=False`` (the caller sends it again itself: the batch script)."""


class Calls:
    """The Redis calls of one store on one client, counted in the store's :class:`~kvcli.store.records.
    StoreStats` (``round_trips``, ``redis_errors``, ``redis_retries``, ``redis_busy_retries``, ``redis_timeouts``)
    and, per shard, in :attr:`shard_trips`.

    Args:
        client: a redis-py client (a single server or a Redis Cluster).
        stats: the store's running totals, updated in place.
        tolerate_unavailable: whether the store absorbs a :class:`RedisUnavailable` (:meth:`absorb`).
        mark: the run's server (:mod:`kvcli.store.runmark`), checked after a dropped connection or a timeout;
            None: never checked.
    """

    def __init__(self, client: redis.Redis | RedisCluster, stats: StoreStats, tolerate_unavailable: bool = False,
                 mark: RunMark | None = None) -> None:
        self.client, self.stats, self.tolerate_unavailable, self.mark = client, stats, tolerate_unavailable, mark
        self.shard_trips = ShardTrips(client)  # round trips per shard: {"host:port": count}
        self._faults = fault_counts(client) or FaultCounts()
        self.busy_seconds = reply_timeout(client) or DEFAULT_TIMEOUT  # the longest a call waits out BUSY replies

    def call(self, fn: Callable, *args, record: bool = True, name: str | None = None, busy_retry: bool = True):
        """``fn(*args)`` as one round trip (counted in ``round_trips`` when ``record``); ``name`` is the command
        named in an error (default: ``fn``'s name, upper case). A BUSY reply sends it again (module docstring;
        a pipeline's ``execute`` with its commands queued again), unless ``busy_retry`` is False.

        Raises:
            RedisUnavailable: the call failed after retries (``final`` once :data:`MAX_FAILURES_IN_ROW` calls in a
                row on this client have), or stayed BUSY for the client's reply timeout; :class:`ScriptKilled`: a
                script of ours was killed.
            ServerBusy: a BUSY reply, with ``busy_retry`` False.
            ServerRestarted: a connection dropped or timed out earlier, and the server is no longer the run's.
            RedisFailure: any other error of the server or the client.
        """
        self.stats.count_round_trips(record)
        faults, st = self._faults, self.stats
        self.verify()
        retries, timeouts = faults.retries, faults.timeouts
        label = name or _name(fn)
        try:
            result = self._busy_retried(fn, args, busy_retry)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            faults.unverified = True  # a connection of its own (the batch script's) has no retry to say so
            timeout = isinstance(exc, redis.exceptions.TimeoutError)
            why = "no reply within the timeout" if timeout else "the connection kept dropping"
            raise self.unavailable(label, why, timeout, str(exc)) from None
        except REDIS_ERRORS as exc:
            if is_script_killed(exc):
                st.count_faults(errors=1)
                raise ScriptKilled(f"Redis {label} failed: a SCRIPT KILL from another client stopped it") from None
            if is_busy(exc) and not busy_retry:
                raise ServerBusy(f"Redis {label} failed: {redis_error_text(exc)}") from None
            if is_busy(exc):
                st.count_faults(timeouts=1)  # no usable reply within the timeout (redis-py counts only its own)
                raise self.unavailable(label, f"busy with another client's script for {self.busy_seconds:g} s, "
                                              f"the reply timeout", True, redis_error_text(exc)) from None
            raise RedisFailure(f"Redis {label} failed: {redis_error_text(exc)}") from None
        finally:
            st.count_faults(retries=faults.retries - retries, timeouts=faults.timeouts - timeouts)
        faults.failed_in_row = 0
        self.verify()  # a connection dropped and was made again during the call: its answer may be another server's
        return result

    def _busy_retried(self, fn: Callable, args: tuple, busy_retry: bool):
        """``fn(*args)``, sent again after each BUSY reply (``busy_retry``) while :attr:`busy_seconds` last."""
        backoff, again = None, _requeue(fn, args)
        while True:
            try:
                return fn(*args)
            except redis.exceptions.ResponseError as exc:
                if not busy_retry or not is_busy(exc):
                    raise
                backoff = backoff or Backoff(self.busy_seconds)
                if not backoff.wait():
                    raise
                self.stats.count_faults(busy_retries=1)
                again()

    def busy_backoff(self) -> Backoff:
        """The waits of a caller that sends a BUSY call again itself (``busy_retry=False``): as :meth:`call`'s."""
        return Backoff(self.busy_seconds)

    def unavailable(self, name: str, why: str, timeout: bool, detail: str = "") -> RedisUnavailable:
        """A call named ``name`` failed for good (``why``, the error's own words in ``detail``; ``timeout``: no
        usable reply in time): counted in ``redis_errors`` and towards :data:`MAX_FAILURES_IN_ROW`; returns the
        error to raise (``final`` once that many failed in a row)."""
        self.stats.count_faults(errors=1)
        return failed_call(self._faults, name, why, timeout, detail)

    def verify(self) -> None:
        """After a dropped connection or a timeout on this client, check that the server is still the run's
        (:func:`~kvcli.store.runmark.check_run`); nothing without a mark. A check that gets no reply (none within
        the timeout, or its connection kept dropping) is a failed call towards :data:`MAX_FAILURES_IN_ROW`, as
        any other (not in the store's ``redis_errors``: it loses nothing, and is made again before the next call);
        a check that fails otherwise (BUSY, a refusal) is made again before the next call, uncounted.

        Raises:
            ServerRestarted: the server restarted, was replaced, or lost the run's keys.
            RedisUnavailable: the check was the last straw (``final``: :data:`MAX_FAILURES_IN_ROW` in a row failed).
        """
        faults = self._faults
        if self.mark is None or not faults.unverified:
            return
        try:
            check_run(self.client, self.mark)
        except REDIS_ERRORS as exc:
            if no_reply(exc):
                error = failed_no_reply(faults, as_no_reply(exc, CHECK))
                if error.final:
                    raise error from None
            return
        faults.unverified = False
        faults.failed_in_row = 0

    def read(self, keys: list[str], record: bool = True) -> list:
        """MGET of ``keys`` (one round trip per shard on a cluster: :func:`kvcli.store.cluster.mget`), counted per
        shard when ``record``. Raises as :meth:`call`."""
        return self.call(mget, self.client, keys, self.shard_trips if record else None, record=record)

    def strlens(self, keys: list[str]) -> list[int]:
        """STRLEN of each of ``keys`` (0 for a missing key), pipelined in one round trip (a cluster's pipeline: one
        per shard). Raises as :meth:`call`."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.strlen(key)
        replies = self.call(functools.partial(pipe.execute, raise_on_error=False), name="STRLEN")
        return [int(n) if isinstance(n, int) else -2 for n in replies]  # -2: another type (the judge's WRONG_TYPE)

    def absorb(self, exc: RedisUnavailable) -> None:
        """Re-raise ``exc`` unless this store absorbs it (a tolerant store, and not the last straw: module
        docstring); the caller then goes on by the rule."""
        if not self.tolerate_unavailable or exc.final:
            raise exc


CHECK = "INFO server / EXISTS (the check that the server is still the run's)"  # verify's calls, in errors


def failed_call(faults: FaultCounts, name: str, why: str, timeout: bool, detail: str) -> RedisUnavailable:
    """One more call in a row on a client that failed for good (named ``name``; ``why``, and the error's own words
    in ``detail``; ``timeout``: no usable reply in time), counted in ``faults.failed_in_row``; returns the error to
    raise, ``final`` once :data:`MAX_FAILURES_IN_ROW` have failed in a row (the server is taken as gone)."""
    faults.failed_in_row += 1
    if faults.failed_in_row >= MAX_FAILURES_IN_ROW:
        return RedisUnavailable(f"the Redis server stopped answering: {faults.failed_in_row} calls in a row "
                                f"failed after retries (last: {name}, {why}: {detail})", timeout, final=True)
    return RedisUnavailable(f"Redis {name} failed after retries ({why}): {detail}", timeout)


def failed_no_reply(faults: FaultCounts, exc: NoReply) -> RedisUnavailable:
    """:func:`failed_call` of a call that got no reply, named and described by ``exc``."""
    return failed_call(faults, exc.command, exc.why, exc.timeout, exc.detail)


def resend(client: redis.Redis | RedisCluster, call: Callable[[], T], *, name: str = "", fresh: bool = False) -> T:
    """``call()``, one of a replay's own calls (not a store's) that may be sent again as it is: it changes nothing
    (INFO, DBSIZE) or does the same again (the sentinel's SET, the UNLINKs of the run's own keys). Under the
    tolerant stores' rule: an attempt that got no reply (:class:`~kvcli.store.noreply.NoReply`, or redis-py's own
    error for it: none within the client's reply timeout, BUSY for that long, or the connection kept dropping) is a
    failed call, counted towards :data:`MAX_FAILURES_IN_ROW` with the stores' calls on ``client`` (one count per
    client), and ``call`` is sent again; an attempt that succeeds starts the count again. So a stall costs a replay
    the same whichever call it lands on: fewer than :data:`MAX_FAILURES_IN_ROW` reply timeouts in a row are waited
    out, that many end the run.

    Args:
        client: the client ``call`` uses (its :class:`~kvcli.store.server.FaultCounts` hold the count).
        name: the command named in the error when ``call`` raises redis-py's error (a :class:`NoReply` names its
            own).
        fresh: start the count at 0 (the run's cleanup, after the failure that ended the run, gets its own tries).

    Raises:
        RedisUnavailable: ``final``: the attempt that made :data:`MAX_FAILURES_IN_ROW` failed calls in a row.
        RedisFailure, redis.RedisError: what ``call`` raises for any other failure (a refusal): not sent again.
    """
    faults = fault_counts(client) or FaultCounts()
    if fresh:
        faults.failed_in_row = 0
    while True:
        try:
            result = call()
        except NoReply as exc:
            error = failed_no_reply(faults, exc)
        except REDIS_ERRORS as exc:
            if not no_reply(exc):
                raise
            error = failed_no_reply(faults, as_no_reply(exc, name or "command"))
        else:
            faults.failed_in_row = 0
            return result
        if error.final:
            raise error from None


def execute_pipeline(pipe) -> list:
    """``pipe.execute()`` of a single server's pipeline (or transaction), with its first error reply raised as
    redis-py raises it, ``Command # 3 (MSET key) of pipeline caused error: OOM ...`` (the form
    :func:`kvcli.errors.redis_error_text` shortens to ``OOM ... (MSET key)``), but naming the failed command by its
    name and first argument only: redis-py's own message joins every argument of it, seconds for a batch's MSET of
    thousands of keys and values, and a copy of every payload it carried. A cluster's pipeline, whose queue
    redis-py keeps to itself, is executed as it is (redis-py's message).

    Returns:
        the replies, one per queued command.

    Raises:
        redis.RedisError: the first error reply, or what ``execute`` itself raises (a dropped connection, a
            timeout, a transaction's EXECABORT).
    """
    if not isinstance(pipe, redis.client.Pipeline):
        return pipe.execute()
    named = [args[:2] for args, _ in pipe.command_stack]
    replies = pipe.execute(raise_on_error=False)
    for number, reply in enumerate(replies, 1):
        if isinstance(reply, Exception):
            words = " ".join(a.decode("utf-8", "replace") if isinstance(a, bytes) else str(a)
                             for a in named[number - 1])
            reply.args = (f"Command # {number} ({words}) of pipeline caused error: {reply.args[0]}", *reply.args[1:])
            raise reply
    return replies


def _requeue(fn: Callable, args: tuple) -> Callable[[], None]:
    """What makes ``fn(*args)`` ready to be called again as the first time: a pipeline's ``execute`` (or a partial
    of it, or a function given the pipeline) empties the pipeline, so its commands are queued again; anything else
    needs nothing."""
    owners = [getattr(fn, "__self__", None), getattr(getattr(fn, "func", None), "__self__", None), *args]
    owner = next((o for o in owners if isinstance(o, redis.client.Pipeline)), None)
    if owner is None:
        return lambda: None
    queued = list(owner.command_stack)

    def again() -> None:
        owner.command_stack = list(queued)

    return again


def _name(fn) -> str:
    """The command a call is named by in errors: the function's name (or a partial's), without underscores."""
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None) or "command"
    return str(name).strip("_").upper()
