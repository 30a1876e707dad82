"""A Redis call that got no reply, as opposed to one the server refused: its error, and how a caller raises it.

redis-py raises ``redis.TimeoutError`` when no reply came within the client's reply timeout (``--redis-timeout``)
and ``redis.ConnectionError`` when the connection kept dropping after its own retries (:mod:`kvcli.store.server`).
Either way the server did not answer: the call may be sent again, and a replay counts it by its rule on failed calls
(:func:`kvcli.store.calls.resend`). Every other error (a refusal: out of memory, an ACL, a syntax error) is the
server's answer, and is not sent again.
"""
from __future__ import annotations

from typing import NoReturn

import redis

from kvcli.errors import RedisFailure


class NoReply(RedisFailure):
    """A call got no usable reply: none within the client's reply timeout (``timeout`` True; also a server BUSY with
    another client's script for that long), or its connection kept dropping after redis-py's retries (``timeout``
    False). The call may be sent again: the server did not answer, it did not refuse. Exit code 3 where it ends a
    command (warm, inspect, purge); a replay applies its rule to it (:func:`kvcli.store.calls.resend`).

    Args:
        command: the command that got no reply (``INFO``), for a message of the caller's.
        message: the one-line error, as any :class:`RedisFailure`'s (``Redis INFO failed: Timeout reading from
            host:port``).
        detail: what redis-py or the server said (``Timeout reading from host:port``), for a message of the
            caller's.
        why: the failure in words (``no reply within the timeout``, ``the connection kept dropping``).
    """

    def __init__(self, command: str, message: str, detail: str, timeout: bool, why: str = "") -> None:
        super().__init__(message)
        self.command, self.detail, self.timeout = command, detail, timeout
        self.why = why or ("no reply within the timeout" if timeout else "the connection kept dropping")

    def __reduce__(self):  # whole across a process boundary (a replay's worker process)
        return type(self), (self.command, str(self), self.detail, self.timeout, self.why)


def no_reply(exc: BaseException) -> bool:
    """Whether ``exc`` is redis-py's word for a call that got no reply (its connection dropped after the retries, or
    no reply within the timeout: ``redis.ConnectionError``, ``redis.TimeoutError``), as opposed to a refusal."""
    return isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError))


def as_no_reply(exc: BaseException, command: str, message: str = "") -> NoReply:
    """redis-py's error for a call of ``command`` that got no reply (:func:`no_reply` is true of ``exc``) as a
    :class:`NoReply` (``message``: its one-line error; default ``Redis COMMAND failed: ...``)."""
    return NoReply(command, message or f"Redis {command} failed: {exc}", str(exc),
                   isinstance(exc, redis.exceptions.TimeoutError))


def raise_no_reply(exc: BaseException, command: str, message: str) -> NoReturn:
    """Raise ``message`` as :class:`NoReply` (of ``command``) when ``exc`` is a call that got no reply
    (:func:`no_reply`), as a plain :class:`RedisFailure` otherwise."""
    if no_reply(exc):
        raise as_no_reply(exc, command, message) from None
    raise RedisFailure(message) from None
