"""Guarded delete of kvcli's keys of ONE namespace (and optionally one chunk size); nothing else on the server. Also
what a namespace holds (:func:`contents`, for the warnings of a read that finds nothing) and its Redis memory.

Keys are found with SCAN ``MATCH kvcli:v1:{namespace}:{chunk_size or *}:* TYPE string`` (glob characters in the
namespace escaped; never KEYS; servers without SCAN's TYPE option (Redis < 6) get a pipelined TYPE per batch), and
each one is parsed back (layout.parse_key's rules) and kept only when its namespace (and chunk size) is exactly the
one asked for, so namespace ``a`` never matches ``a:b``'s keys, and a key outside kvcli's layout is never deleted:
not a chunk size kvcli would write (``0``, ``04``), not 32 lowercase hex digits, not ``m``/``p``, or not a string
(kvcli writes nothing else). Deletion is UNLINK (Redis >= 4) in pipelined batches; never FLUSHDB or
FLUSHALL. :func:`count` first (read-only), then :func:`purge` (the CLI requires ``--yes`` between the two).
The namespace :data:`~kvcli.store.layout.ROUTE_NAMESPACE` also holds ``kvcli route``'s cache-manager indexes, sets
named by :func:`~kvcli.store.layout.route_index_prefix` (found with ``TYPE set``, each name checked the same way):
purging that namespace whole deletes them too (``route_index`` in the count); a chunk size never selects them.

On a Redis Cluster both SCAN every primary (:func:`kvcli.store.cluster.scan`: refused unless the cluster serves
every slot, and a shard that fails fails the command, so a count is never one shard's), count keys per shard
(``by_shard``), and UNLINK each SCAN batch one key per command, one round trip per shard
(:func:`kvcli.store.cluster.unlink`).
"""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import redis
from redis.cluster import RedisCluster

from kvcli.errors import BadInputError, RedisFailure
from kvcli.store import cluster
from kvcli.store.busy import Backoff, is_busy
from kvcli.store.layout import KEY_ROOT, KEY_VERSION, ROUTE_KIND, ROUTE_NAMESPACE, is_route_index_key
from kvcli.store.noreply import raise_no_reply
from kvcli.store.runmark import SENTINEL_TAIL
from kvcli.store.server import ENV_URL, RedisTarget, script_refused

BUSY_WAIT = 60.0  # seconds a cleanup waits, at most, for a script of another client to end (BUSY replies)
BATCH = 5000  # keys per SCAN step (a hint to the server): fewer round trips over a large namespace


@dataclass
class PurgeCount:
    """kvcli keys of one namespace (and chunk size): metadata entries and payloads, per chunk size and per shard
    (``{"host:port": keys}``: the one server, or every primary of a cluster), and route index keys (sets of
    ``kvcli route``'s cache-manager index, in :data:`~kvcli.store.layout.ROUTE_NAMESPACE` only)."""

    namespace: str
    chunk_size: int | None
    metadata: int = 0
    payloads: int = 0
    by_chunk_size: dict[int, int] = field(default_factory=dict)
    by_shard: dict[str, int] = field(default_factory=dict)
    deleted: int = 0
    route_index: int = 0

    @property
    def keys(self) -> int:
        """All matching keys (metadata + payloads + route index keys)."""
        return self.metadata + self.payloads + self.route_index

    def to_dict(self) -> dict:
        """JSON-ready, with ``keys``."""
        return {**self.__dict__, "keys": self.keys}


def _pattern(namespace: str, chunk_size: int | None) -> str:
    return f"{KEY_ROOT}:{KEY_VERSION}:{glob_escape(namespace)}:{chunk_size if chunk_size else '*'}:*"


def glob_escape(text: str) -> str:
    """``text`` with SCAN MATCH's glob characters (``*?[]\\``) escaped: it matches only itself."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _check(namespace: str, chunk_size: int | None) -> None:
    if not namespace:
        raise BadInputError("purge needs a namespace name (--namespace NAME)")
    if chunk_size is not None and chunk_size < 1:
        raise BadInputError(f"chunk size must be >= 1, got {chunk_size}")


def _matching(client, namespace: str, chunk_size: int | None):
    """Batches ``(shard, [(key, chunk size, kind)])`` of exactly this namespace's chunk keys (strings only), every
    shard of a cluster (:func:`kvcli.store.cluster.check_whole` first: never a partial view); in
    :data:`~kvcli.store.layout.ROUTE_NAMESPACE` without a chunk size, then its route index keys (sets; chunk size 0,
    kind ``b"r"``).

    Each chunk key is ``{prefix}{chunk_size}:{m|p}:{32 hex}`` (layout.parse_key's rules, the namespace prefix being
    matched already by the SCAN pattern). A run's cleanup checks hundreds of thousands of keys, so a SCAN step's
    keys are matched by one regex over them joined by newlines (C speed), unless a key holds a newline itself (then
    one match per key).

    Raises:
        NoReply: SCAN (or TYPE) got no reply (within the timeout, or the connection kept dropping).
        RedisFailure: SCAN (or TYPE) was refused (an ACL).
    """
    _check(namespace, chunk_size)
    size = rb"[1-9][0-9]*" if chunk_size is None else str(chunk_size).encode()
    body = re.escape(_prefix(namespace)) + rb"(" + size + rb"):([mp]):[0-9a-f]{32}"
    joined = re.compile(rb"^(" + body + rb")$", re.MULTILINE).findall
    single = re.compile(body).fullmatch

    def chunk_keys(keys: list[bytes]) -> list:
        blob = b"\n".join(keys)
        if blob.count(b"\n") == len(keys) - 1:  # no key holds a newline: every line is one key
            return [(k, int(cs), kind) for k, cs, kind in joined(blob)]
        return [(k, int(m[1]), m[2]) for k in keys if (m := single(k)) is not None]

    cluster.check_whole(client)
    yield from _scan(client, _pattern(namespace, chunk_size), "string", chunk_keys)
    if namespace == ROUTE_NAMESPACE and chunk_size is None:
        yield from _scan(client, f"{KEY_ROOT}:{KEY_VERSION}:{ROUTE_NAMESPACE}:{ROUTE_KIND}:*", "set",
                         lambda keys: [(k, 0, b"r") for k in keys if is_route_index_key(k)])


def _scan(client, pattern: str, kind: str, select):
    """Batches ``(shard, select(keys))`` of the keys of type ``kind`` that SCAN MATCH ``pattern`` finds on every
    shard (empty batches left out). Raises RedisFailure."""
    for shard, node in cluster.shards(client):
        cursor, typed = 0, True
        while True:
            try:
                cursor, found = node.scan(cursor, match=pattern, count=BATCH, **({"_type": kind} if typed else {}))
                keys = cast(list[bytes], found)  # bytes: kvcli's clients never decode responses
            except redis.exceptions.ResponseError as exc:
                if typed and "syntax" in str(exc).lower():  # Redis < 6: no TYPE option; check each key below
                    typed = False
                    continue
                raise RedisFailure(f"Redis SCAN failed on {shard}: {exc}") from None
            except cluster.REDIS_ERRORS as exc:
                raise_no_reply(exc, "SCAN", f"Redis SCAN failed on {shard}: {exc}")
            mine = select(keys) if keys else []
            if mine and not typed:
                mine = _of_type(node, mine, kind)
            if mine:
                yield shard, mine
            if cursor == 0:
                break


def _of_type(client: redis.Redis, batch, kind: str):
    pipe = client.pipeline(transaction=False)
    for key, _, _ in batch:
        pipe.type(key)
    try:
        kinds = pipe.execute()
    except redis.RedisError as exc:
        raise_no_reply(exc, "TYPE", f"Redis TYPE failed: {exc}")
    return [entry for entry, found in zip(batch, kinds) if found in (kind.encode(), kind)]


def _tally(result: PurgeCount, shard: str, batch) -> None:
    result.by_shard[shard] = result.by_shard.get(shard, 0) + len(batch)
    for _, size, kind in batch:
        if kind == b"r":
            result.route_index += 1
            continue
        result.by_chunk_size[size] = result.by_chunk_size.get(size, 0) + 1
        result.metadata += kind == b"m"
        result.payloads += kind == b"p"


def _prefix(namespace: str) -> bytes:
    return f"{KEY_ROOT}:{KEY_VERSION}:{namespace}:".encode()


def count(client: redis.Redis | RedisCluster, namespace: str, chunk_size: int | None = None) -> PurgeCount:
    """How many keys :func:`purge` would delete now, by kind and chunk size. Read-only."""
    result = PurgeCount(namespace, chunk_size, by_shard={name: 0 for name, _ in cluster.shards(client)})
    for shard, batch in _matching(client, namespace, chunk_size):
        _tally(result, shard, batch)
    result.by_chunk_size = dict(sorted(result.by_chunk_size.items()))
    return result


def purge(client: redis.Redis | RedisCluster, namespace: str, chunk_size: int | None = None, pipeline_batches: int = 16
          ) -> PurgeCount:
    """Delete kvcli's keys of ``namespace`` (and ``chunk_size``): UNLINK of each SCAN batch, pipelined.

    Returns what was found, with ``deleted`` = keys the server removed (a key that expired or was evicted between
    SCAN and UNLINK is found but not deleted).

    Raises:
        BadInputError: empty namespace or bad chunk size.
        RedisFailure: a command failed (refused, no reply within the timeout, connection gone); keys of earlier
            batches are deleted, and the message says how many.
    """
    result = PurgeCount(namespace, chunk_size, by_shard={name: 0 for name, _ in cluster.shards(client)})
    if cluster.is_cluster(client):  # one UNLINK per key, one round trip per shard, for each SCAN batch
        try:
            for shard, batch in _matching(client, namespace, chunk_size):
                _tally(result, shard, batch)
                try:
                    result.deleted += cluster.unlink(client, [key for key, _, _ in batch])
                except cluster.REDIS_ERRORS as exc:
                    raise RedisFailure(f"Redis UNLINK failed: {exc}") from None
        except RedisFailure as exc:
            raise RedisFailure(f"{str(exc).rstrip('.')}; {result.deleted:,} keys deleted before it") from None
        result.by_chunk_size = dict(sorted(result.by_chunk_size.items()))
        return result
    pipe, queued = client.pipeline(transaction=False), 0
    try:
        for shard, batch in _matching(client, namespace, chunk_size):
            _tally(result, shard, batch)
            pipe.unlink(*[key for key, _, _ in batch])
            queued += 1
            if queued == pipeline_batches:
                result.deleted += _flush(pipe)
                queued = 0
        if queued:
            result.deleted += _flush(pipe)
    except RedisFailure as exc:
        raise RedisFailure(f"{str(exc).rstrip('.')}; {result.deleted:,} keys deleted before it") from None
    result.by_chunk_size = dict(sorted(result.by_chunk_size.items()))
    return result


# One step of purge_own inside the server: SCAN a batch of string keys matching the layout's glob, UNLINK them (in
# slices: Lua's unpack has a stack limit), return the next cursor and how many were deleted.
_PURGE_OWN_STEP = """
local scan = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3], 'TYPE', 'string')
local keys, deleted = scan[2], 0
for i = 1, #keys, 1000 do deleted = deleted + redis.call('UNLINK', unpack(keys, i, math.min(i + 999, #keys))) end
return {scan[1], deleted}
"""


def purge_own(client: redis.Redis | RedisCluster, namespace: str) -> int:
    """Delete a namespace that this process created and alone wrote (a replay's own, named at random, where its
    record of what it wrote is incomplete: :func:`kvcli.store.kvstore.purge_run`): one script
    per SCAN step deletes the matching keys inside the server, so no key crosses the network (a replay's cleanup of
    113,835 keys: ~0.13 s instead of ~0.25 s here). The glob is kvcli's layout up to the key kind
    (``{prefix}[1-9]*:[mp]:*``; the 32 hex digits spelled out would make the cleanup ~20% slower); the exact
    per-key parse of :func:`purge` is not needed for keys only this run wrote.
    On a cluster, or where the server or the user refuses the script (no scripting, Redis < 6 without SCAN's TYPE
    option, an ACL), the same keys go through :func:`purge`. While another client's script holds the server
    (BUSY), a step is sent again (:class:`~kvcli.store.busy.Backoff`), for up to :data:`BUSY_WAIT` seconds.
    Returns the keys deleted.

    Raises:
        NoReply: a step got no reply (within the timeout, or the connection kept dropping): the deletion may be
            made again. RedisFailure: a step was refused after the first. Either way keys of earlier steps are
            deleted, and the message says how many.
    """
    _check(namespace, None)
    if cluster.is_cluster(client):
        return purge(client, namespace).deleted
    glob = f"{KEY_ROOT}:{KEY_VERSION}:{glob_escape(namespace)}:[1-9]*:[mp]:*"
    cursor, deleted, first = b"0", 0, True
    step = client.register_script(_PURGE_OWN_STEP)
    backoff = None  # while another client's script holds the server (BUSY), the step waits and is sent again
    try:
        while first or cursor not in (b"0", "0", 0):
            try:
                cursor, n = step(keys=[], args=[cursor, glob, BATCH])
            except redis.exceptions.ResponseError as exc:
                if not is_busy(exc):
                    raise
                backoff = backoff or Backoff(BUSY_WAIT)
                if not backoff.wait():
                    raise
                continue
            deleted, first, backoff = deleted + int(n), False, None
    except redis.exceptions.ResponseError as exc:
        if first and script_refused(exc):
            return purge(client, namespace).deleted  # nothing was deleted: the client-side purge does it all
        raise RedisFailure(f"Redis UNLINK failed: {exc}; {deleted:,} keys deleted before it") from None
    except cluster.REDIS_ERRORS as exc:
        raise_no_reply(exc, "UNLINK", f"Redis UNLINK failed: {exc}; {deleted:,} keys deleted before it")
    return deleted


def purge_command(target: RedisTarget, namespace: str, chunk_size: int | None = None, layout: str = "kvcli") -> str:
    """The exact ``kvcli purge`` command that deletes ``namespace`` (its ``layout``'s keys) on ``target``, for
    messages. The password is never printed: it is masked (``***``, with a note to put it back), or left out when
    ``REDIS_URL`` holds it."""
    command = f"kvcli purge --namespace {shlex.quote(namespace)}"
    command += f" --chunk-size {chunk_size}" if chunk_size else ""
    command += f" --layout {layout}" if layout != "kvcli" else ""
    secret = target.display != target.url
    if secret and os.environ.get(ENV_URL) == target.url:  # the password stays in REDIS_URL: the command is exact
        return f"{command} --yes"
    note = " (put the password back in place of ***, or set REDIS_URL)" if secret else ""
    return f"{command} --yes --redis-url {shlex.quote(target.display)}{note}"


def _flush(pipe) -> int:
    try:
        return sum(int(n) for n in pipe.execute())
    except cluster.REDIS_ERRORS as exc:
        raise RedisFailure(f"Redis UNLINK failed: {exc}") from None


def scan_keys(client, pattern: str | None = None, count: int = 2000) -> Iterator[list[bytes]]:
    """Keys of the current database (SCAN MATCH ``pattern``, every key when None), a SCAN step at a time (a cursor;
    never KEYS), without parsing them; every primary of a cluster (:func:`kvcli.store.cluster.scan`). Raises
    RedisFailure."""
    for _, keys in cluster.scan(client, pattern, count):
        yield keys


def redis_memory(client, pattern: str, sample: int, keys: int | None = None) -> tuple[int, int]:
    """Redis's own memory for one store's keys (SCAN MATCH ``pattern``): ``MEMORY USAGE`` of up to ``sample``
    keys, scaled to all of them. Returns ``(bytes, sampled keys)``; exact when every key was sampled.

    ``keys``: the store's key count when the caller knows it exactly (an index-only replay: its metadata entries
    less its evictions); the SCAN then stops once ``sample`` keys are read, instead of counting them all.

    Raises:
        NoReply: SCAN or MEMORY USAGE got no reply (within the timeout, or the connection kept dropping): the read
            may be made again. RedisFailure: one failed otherwise (e.g. refused by an ACL).
    """
    total = sampled = seen = 0
    pipe = client.pipeline(transaction=False)
    for batch in scan_keys(client, pattern):
        for key in batch:
            if key.endswith(SENTINEL_TAIL):  # the run's own marker, not a chunk (SCAN replies are bytes)
                continue
            seen += 1
            if sampled < sample:
                pipe.memory_usage(key, samples=0)
                sampled += 1
        if keys is not None and sampled >= sample:
            break
    if sampled:
        try:
            total = sum(int(x or 0) for x in pipe.execute())
        except cluster.REDIS_ERRORS as exc:
            raise_no_reply(exc, "MEMORY USAGE", f"Redis MEMORY USAGE failed: {exc}")
    seen = keys if keys is not None and sampled >= sample else seen
    return (int(total * seen / sampled) if sampled else 0), sampled


@dataclass
class SizeContents:
    """What one chunk size of a namespace holds: key counts, and models named by a sample of its metadata."""

    chunk_size: int
    metadata: int = 0
    payloads: int = 0
    models: dict[str, int] = field(default_factory=dict)  # model id -> metadata entries in the sample
    sampled: int = 0


def contents(client: redis.Redis | RedisCluster, namespace: str, sample: int = 100) -> dict[int, SizeContents]:
    """What ``namespace`` holds, per chunk size: metadata and payload keys (counted over one SCAN) and the models
    named by up to ``sample`` metadata values per chunk size (read with MGET). Read-only.

    Raises:
        NoReply: a read got no reply (within the timeout, or the connection kept dropping).
        RedisFailure: the server refused a read.
    """
    from kvcli.store.layout import parse_metadata
    from kvcli.store.serde import PayloadError

    out: dict[int, SizeContents] = {}
    todo: dict[int, list[bytes]] = {}
    for _, batch in _matching(client, namespace, None):
        for key, size, kind in batch:
            if kind == b"r":  # a route index key: no chunk
                continue
            entry = out.setdefault(size, SizeContents(size))
            if kind == b"m":
                entry.metadata += 1
                if len(todo.setdefault(size, [])) < sample:
                    todo[size].append(key)
            else:
                entry.payloads += 1
    for size, keys in todo.items():
        try:
            values = cluster.mget(client, keys)
        except cluster.REDIS_ERRORS as exc:
            raise_no_reply(exc, "MGET", f"Redis MGET failed: {exc}")
        for value in values:
            if value is None:
                continue
            try:
                model = parse_metadata(value).model
            except PayloadError:
                model = "(unreadable metadata)"
            out[size].models[model] = out[size].models.get(model, 0) + 1
            out[size].sampled += 1
    return dict(sorted(out.items()))


def describe(found: dict[int, SizeContents]) -> str:
    """``"chunk size 16: 12 metadata, 12 payloads (model kvcli/tiny@seed1:fp32); ..."`` or ``"no kvcli keys"``."""
    if not found:
        return "no kvcli keys"
    parts = []
    for c in found.values():
        models = ", ".join(sorted(c.models)) or "no readable metadata"
        of = f"; models in a sample of {c.sampled:,}" if c.sampled < c.metadata else ""
        parts.append(f"chunk size {c.chunk_size}: {c.metadata:,} metadata, {c.payloads:,} payloads "
                     f"(model{'s' if len(c.models) > 1 else ''} {models}{of})")
    return "; ".join(parts)


def absent_note(found: dict[int, SizeContents], namespace: str, model_id: str, chunk_size: int,
                cause: str = "") -> str:
    """Why a namespace read for ``model_id`` at ``chunk_size`` gave no hit, naming what it does hold. ``cause``: a
    cause the caller found in the prompt itself (a double BOS: :func:`kvcli.traces.bos.prompt_bos_note`), said in
    place of the guess at another tokenizer or cache salt (and after the guess at another model)."""
    here = found.get(chunk_size)
    if here is not None and model_id in here.models:
        why = cause or "no prompt starts with a stored chunk (another tokenizer or cache salt?)"
        return (f"namespace {namespace!r} gave no hit at chunk size {chunk_size} although it holds model {model_id} "
                f"there: {why}; it holds: {describe(found)}")
    also = f"; {cause}" if cause else ""
    return (f"namespace {namespace!r} holds nothing for model {model_id} at chunk size {chunk_size} (another "
            f"--seed, --model, --dtype or chunk size, or a typo?); it holds: {describe(found)}{also}")
