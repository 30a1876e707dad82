"""Read an LMCache Redis backend without touching it: which of LMCache's layouts its keys are in, and per layout its
chunks by model, their metadata records, bytes, orphans and memory.

Three layouts share a server (:mod:`kvcli.store.lmcache`, :mod:`kvcli.store.lmcache_mp`; LMCache 0.5.6 and its
main agree), each key named by :func:`kvcli.store.lmcache.classify_key`:

* ``lmcache``, the ``redis://`` connector: two keys per chunk, ``<key>metadata`` (a 28-byte record for one KV group,
  8 + 20 per group) and ``<key>kv_bytes`` (the KV tensor bytes), where ``<key>`` is
  ``{model_name}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}[@{layer_id}][@{tag}%{value}...]``;
* ``lmcache-resp``, the ``resp://`` connector: one key per chunk, the bare ``<key>``, holding the raw chunk;
* ``lmcache-mp``, multiprocess mode: one key per chunk and object group,
  ``{model_name}@{kv_rank:08x}@{object_group_id:x}@{chunk_hash hex}[@{cache_salt}]``, holding the raw chunk.

A key that looks like LMCache's but is in none of them (:func:`kvcli.store.lmcache.unknown_model`, e.g. the
three-field ``{model}@{rank}@{hash}`` of an older multiprocess mode) is counted as an *unknown LMCache layout*, by
its first field, with a few example keys, and never read as one of the three.

The one-key layouts keep no metadata: per model, kvcli reports their keys, value bytes (whose sizes say the chunk
length for a known model), memory, TTLs, what the keys say (world sizes, ranks, dtypes, tags, object groups, hash
widths, salted keys) and the empty values (kvcli's replay writes an accounted chunk that way; LMCache never does).

Strictly read-only, like :mod:`kvcli.live.inspect`: keys are listed with SCAN (never KEYS) over one ``CLIENT
NO-TOUCH`` connection (:func:`kvcli.live.reading.reader`); each SCAN step's reads go out in one round trip (MGET
of the metadata values and one EVAL_RO for every key's PTTL, STRLEN and MEMORY USAGE, or the same commands
pipelined where scripts are refused). KV bytes are never read: their size is STRLEN. Any key in no LMCache
layout is counted as "other" and nothing else is done with it; so is a ``kv_bytes`` key or a one-key layout's key
that does not hold a string. Keys of LMCache 0.3.x's older layout (a leading ``{fmt}@`` field:
:func:`kvcli.store.lmcache.legacy_model`) are counted apart, by model, and not read either.

Per ``redis://`` model (the key's ``model_name``):
  * chunks: complete pairs, whose record decodes and whose kv_bytes value holds exactly the record's ``length``
    bytes (what LMCache's get copies); a layer-wise cache holds one pair per chunk and layer;
  * orphan metadata (a record without kv bytes: LMCache's lookup counts it as a hit, its get then misses and
    deletes the record), orphan kv bytes (kv bytes without a record: invisible to lookups, memory held for
    nothing), bad metadata (not a record), length mismatch (record length differs from the kv bytes' size).
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import redis
from redis.cluster import RedisCluster

from kvcli.live.inspect import SCAN_COUNT, ShardView, quotas, shard_skew, shard_views, shards_to_dict
from kvcli.live.reading import execute_read, read_key_facts, reader
from kvcli.store import cluster
from kvcli.store.lmcache import (
    KEY_FORMAT,
    KV_SUFFIX,
    LEGACY,
    LEGACY_KEY_FORMAT,
    LEGACY_VERSIONS,
    LMCACHE_COMMIT,
    LMCACHE_MAIN,
    LMCACHE_VERSION,
    METADATA_SUFFIX,
    MP,
    REDIS,
    RESP,
    RESP_KEY_FORMAT,
    UNKNOWN,
    LMCacheKey,
    RemoteRecord,
    classify_key,
    unpack_record,
)
from kvcli.store.lmcache_mp import MP_KEY_FORMAT, MPKey, split_kv_rank
from kvcli.store.preflight import ServerMemory, server_memory

ISSUE_KEYS_LISTED = 100
UNKNOWN_EXAMPLES = 5  # example keys of an unknown LMCache layout kept for the report
_RNG = np.random.default_rng()
_MATCHED = f"LMCache {LMCACHE_VERSION} (git {LMCACHE_COMMIT}; main: {LMCACHE_MAIN})"
#: each layout kvcli reads: its name, LMCache's writer, the key format
LAYOUT_INFO = {
    REDIS: {"writer": "redis:// connector (RedisConnector)", "key_format": KEY_FORMAT, "matched": _MATCHED},
    RESP: {"writer": "resp:// connector (RESPConnector)", "key_format": RESP_KEY_FORMAT, "matched": _MATCHED},
    MP: {"writer": "multiprocess mode, RESP L2 adapter (NativeConnectorL2Adapter)", "key_format": MP_KEY_FORMAT,
         "matched": _MATCHED},
}


class _Chunk:
    """Raw facts of one chunk's two keys, gathered during the scan."""

    __slots__ = ("key", "meta", "kv_bytes", "ttls", "memory")

    def __init__(self, key: LMCacheKey) -> None:
        self.key = key
        self.meta: bytes | None = None  # the metadata value (b"" for a metadata key that holds no string)
        self.kv_bytes: int | None = None  # STRLEN of the kv_bytes value
        self.ttls = 0  # keys of the pair with a TTL
        self.memory: dict[str, int] = {}  # suffix -> MEMORY USAGE bytes


@dataclass
class LMCacheGroup:
    """One model's LMCache chunks: counts, value bytes, Redis memory (scaled when sampled), what the keys and
    records say (histograms over chunks), integrity problems (module docstring)."""

    model_name: str
    chunks: int = 0
    metadata_keys: int = 0
    kv_keys: int = 0
    metadata_value_bytes: int = 0
    kv_value_bytes: int = 0
    memory_bytes: int | None = None  # None: not measured
    memory_sampled_keys: int = 0
    keys_with_ttl: int = 0
    layerwise_chunks: int = 0
    by_world_size: Counter = field(default_factory=Counter)
    by_worker_id: Counter = field(default_factory=Counter)
    by_dtype: Counter = field(default_factory=Counter)
    by_format: Counter = field(default_factory=Counter)
    by_chunk_tokens: Counter = field(default_factory=Counter)
    by_shape: Counter = field(default_factory=Counter)
    by_tag: Counter = field(default_factory=Counter)
    issues: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    example: dict | None = None

    def to_dict(self) -> dict:
        """JSON-ready: histograms as ``{value: chunks}``, integrity as counts plus up to 100 key strings each."""
        out = {k: v for k, v in self.__dict__.items() if k != "issues"}
        for name, value in out.items():
            if isinstance(value, Counter):
                out[name] = {str(k): n for k, n in sorted(value.items(), key=lambda kv: str(kv[0]))}
        out["integrity"] = {name: len(keys) for name, keys in sorted(self.issues.items())}
        out["integrity_keys"] = {name: sorted(keys)[:ISSUE_KEYS_LISTED] for name, keys in sorted(self.issues.items())}
        return out


class _Value:
    """Raw facts of one key of a one-key layout (``resp://``, multiprocess), gathered during the scan."""

    __slots__ = ("layout", "key", "size", "ttl", "memory")

    def __init__(self, layout: str, key: LMCacheKey | MPKey, size: int, ttl: bool) -> None:
        self.layout, self.key, self.size, self.ttl = layout, key, size, ttl
        self.memory: int | None = None  # MEMORY USAGE bytes


@dataclass
class OneKeyGroup:
    """One model's keys in a one-key layout (``lmcache-resp`` or ``lmcache-mp``): counts, value bytes, Redis memory
    (scaled when sampled), what the keys say (histograms over keys) and the empty values (module docstring).

    ``by_worker_id`` is the worker id of a ``resp://`` key and the global rank of a multiprocess key's KV rank;
    ``by_world_size`` the world size of either. Only ``lmcache-resp``: ``by_dtype``, ``by_tag``,
    ``layerwise_keys``. Only ``lmcache-mp``: ``by_kv_rank`` (8 hex digits), ``by_object_group``,
    ``by_hash_bytes``, ``salted_keys`` and ``salts`` (distinct salts; the salts themselves are not listed)."""

    layout: str
    model_name: str
    keys: int = 0
    value_bytes: int = 0
    empty_values: int = 0
    memory_bytes: int | None = None  # None: not measured
    memory_sampled_keys: int = 0
    keys_with_ttl: int = 0
    by_value_bytes: Counter = field(default_factory=Counter)
    by_world_size: Counter = field(default_factory=Counter)
    by_worker_id: Counter = field(default_factory=Counter)
    by_dtype: Counter = field(default_factory=Counter)
    by_tag: Counter = field(default_factory=Counter)
    layerwise_keys: int = 0
    by_kv_rank: Counter = field(default_factory=Counter)
    by_object_group: Counter = field(default_factory=Counter)
    by_hash_bytes: Counter = field(default_factory=Counter)
    salted_keys: int = 0
    salts: int = 0
    example: dict | None = None
    _salts: set = field(default_factory=set, repr=False)

    def to_dict(self) -> dict:
        """JSON-ready: histograms as ``{value: keys}``, the other layout's fields left out."""
        other = (("by_kv_rank", "by_object_group", "by_hash_bytes", "salted_keys", "salts") if self.layout == RESP
                 else ("by_dtype", "by_tag", "layerwise_keys"))
        out = {k: v for k, v in self.__dict__.items() if k not in other and not k.startswith("_")}
        for name, value in out.items():
            if isinstance(value, Counter):
                out[name] = {str(k): n for k, n in sorted(value.items(), key=lambda kv: str(kv[0]))}
        return out


@dataclass
class UnknownLayout:
    """Keys that look like LMCache's but are in none of its layouts kvcli knows (module docstring): their count
    by first ``@`` field and up to :data:`UNKNOWN_EXAMPLES` of them (the first in key order)."""

    keys: int = 0
    by_first_field: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def add(self, key: bytes, first: str) -> None:
        """Count one key (``first``: its first ``@`` field)."""
        self.keys += 1
        self.by_first_field[first] += 1
        self.examples = sorted([*self.examples, key.decode(errors="replace")])[:UNKNOWN_EXAMPLES]

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"keys": self.keys, "by_first_field": dict(sorted(self.by_first_field.items())),
                "examples": self.examples}


@dataclass
class LMCacheInspection:
    """The whole read: server state, key counts per layout (``redis://`` in ``lmcache_keys``, ``resp://``,
    multiprocess, LMCache 0.3.x's older layout, unknown LMCache layouts, other), one group per model and layout,
    how memory was read. ``legacy_models``: keys of the older layout per model name (not read further); a shard's
    ``keys`` counts the keys of the three layouts, its ``other_keys`` every other key (older and unknown layouts
    included)."""

    server: ServerMemory
    scanned_keys: int = 0
    lmcache_keys: int = 0
    resp_keys: int = 0
    mp_keys: int = 0
    legacy_keys: int = 0
    other_keys: int = 0
    legacy_models: Counter = field(default_factory=Counter)
    groups: list[LMCacheGroup] = field(default_factory=list)
    resp_groups: list[OneKeyGroup] = field(default_factory=list)
    mp_groups: list[OneKeyGroup] = field(default_factory=list)
    unknown: UnknownLayout = field(default_factory=UnknownLayout)
    memory_sampled: int | None = None  # None: MEMORY USAGE of every key; 0: not read; N: a sample of N keys
    seconds: float = 0.0
    no_touch: bool | None = None
    cluster: bool = False
    shards: list[ShardView] = field(default_factory=list)  # LMCache keys, other keys and INFO memory per primary

    @property
    def skew(self) -> dict:
        """Largest shard over the mean, of LMCache keys and of used_memory (None: nothing to compare)."""
        return shard_skew(self.shards, "lmcache")

    @property
    def known_keys(self) -> int:
        """Keys of the three layouts kvcli reads."""
        return self.lmcache_keys + self.resp_keys + self.mp_keys

    def layouts(self) -> list[dict]:
        """Every LMCache layout found on the server, by name, with its key count (and for the known ones LMCache's
        writer, key format and the version matched): ``lmcache``, ``lmcache-resp``, ``lmcache-mp``, ``legacy``
        (LMCache 0.3.x), ``unknown``."""
        found = [{"name": name, **LAYOUT_INFO[name], "keys": n}
                 for name, n in ((REDIS, self.lmcache_keys), (RESP, self.resp_keys), (MP, self.mp_keys)) if n]
        if self.legacy_keys:
            found.append({"name": LEGACY, "writer": "redis:// connector", "key_format": LEGACY_KEY_FORMAT,
                          "matched": f"LMCache {LEGACY_VERSIONS}", "keys": self.legacy_keys})
        if self.unknown.keys:
            found.append({"name": UNKNOWN, "writer": None, "key_format": None,
                          "matched": "none: keys like LMCache's in no layout kvcli knows", "keys": self.unknown.keys})
        return found

    def to_dict(self) -> dict:
        """JSON-ready, with the layouts found and the LMCache version matched."""
        return {"layout": {"name": "lmcache", "keys": KEY_FORMAT,
                           "matched": f"LMCache {LMCACHE_VERSION} (git {LMCACHE_COMMIT}), redis:// connector"},
                "layouts": self.layouts(),
                "server": self.server.to_dict(), "keys": {"scanned": self.scanned_keys, "lmcache": self.lmcache_keys,
                "lmcache_resp": self.resp_keys, "lmcache_mp": self.mp_keys, "lmcache_legacy": self.legacy_keys,
                "lmcache_unknown": self.unknown.keys, "other": self.other_keys},
                "legacy_layout": {"keys": LEGACY_KEY_FORMAT, "matched": f"LMCache {LEGACY_VERSIONS}",
                                  "keys_by_model": dict(sorted(self.legacy_models.items()))},
                "memory_sampled_keys": self.memory_sampled, "no_touch": self.no_touch,
                "seconds": self.seconds, "cluster": self.cluster,
                "shards": shards_to_dict(self.shards, "lmcache", self.known_keys), "skew": self.skew,
                "groups": [g.to_dict() for g in self.groups],
                "resp_groups": [g.to_dict() for g in self.resp_groups],
                "mp_groups": [g.to_dict() for g in self.mp_groups], "unknown": self.unknown.to_dict()}


def inspect_lmcache(client: redis.Redis | RedisCluster, sample: int | None = None) -> LMCacheInspection:
    """Read every LMCache key once (read-only, one NO-TOUCH connection) and summarise it by model.

    Args:
        sample: MEMORY USAGE of every LMCache key (None), of none (0), or of N keys spread over the models
            (:func:`kvcli.live.inspect.quotas`), each model's reading scaled up to its key count.

    Raises:
        RedisFailure: the server refused a read.
    """
    with reader(client) as conn:
        t0 = time.perf_counter()
        cluster.check_whole(conn)  # before INFO: a cluster that is not whole is refused, not summed
        result = LMCacheInspection(server_memory(conn), memory_sampled=sample, cluster=cluster.is_cluster(conn))
        result.shards = shard_views(conn, result.server, False)  # MEMORY USAGE is read per model, not per shard
        views = {v.name: v for v in result.shards}
        chunks: dict[bytes, _Chunk] = {}
        values: dict[bytes, _Value] = {}
        script = [not result.cluster]  # a script's keys must share a slot: per-key reads on a cluster
        for shard, keys in cluster.scan(conn, count=SCAN_COUNT):
            result.scanned_keys += len(keys)
            mine = []
            for key in keys:
                got = classify_key(key)
                if got is None:
                    continue
                if got[0] == LEGACY:
                    result.legacy_models[got[1]] += 1
                elif got[0] == UNKNOWN:
                    result.unknown.add(key, str(got[1]))
                else:
                    mine.append((key, *got))
            read = _read_batch(conn, mine, chunks, values, sample is None, script) if mine else Counter()
            result.lmcache_keys += read[REDIS]
            result.resp_keys += read[RESP]
            result.mp_keys += read[MP]
            views[shard].keys += read.total()
            views[shard].other_keys += len(keys) - read.total()
        result.legacy_keys = result.legacy_models.total()
        result.other_keys = result.scanned_keys - result.known_keys - result.legacy_keys - result.unknown.keys
        if sample:
            result.memory_sampled = _sampled_memory(conn, chunks, values, sample)
        result.groups = _groups(chunks)
        result.resp_groups = _value_groups(values, RESP)
        result.mp_groups = _value_groups(values, MP)
        result.seconds = time.perf_counter() - t0
        result.no_touch = bool(getattr(conn, "kvcli_no_touch", False))
    return result


def _read_batch(client, mine: list[tuple[bytes, str, object]], chunks: dict[bytes, _Chunk],
                values: dict[bytes, _Value], with_memory: bool, script: list[bool]) -> Counter:
    """One round trip per SCAN step (see the module docstring) for ``mine``, ``(key, layout, parsed)`` of each
    key in a layout kvcli reads. Returns the keys counted per layout: a ``kv_bytes`` key or a one-key layout's key
    that holds no string is not (the caller counts it as another key); one gone since the SCAN is."""
    keys = [key for key, _, _ in mine]
    metas = [key for key, layout, parsed in mine
             if layout == REDIS and cast("tuple[LMCacheKey, str]", parsed)[1] == METADATA_SUFFIX]
    meta_values, facts = read_key_facts(client, keys, metas, with_memory, script)
    metas_read, width = iter(meta_values), 2 + with_memory
    counted: Counter[str] = Counter()
    for i, (key, layout, parsed) in enumerate(mine):
        pttl, size = int(facts[width * i]), facts[width * i + 1]
        wrong_type = isinstance(size, Exception) or int(size) < 0
        usage = facts[width * i + 2] if with_memory else None
        usage = None if usage is None or isinstance(usage, Exception) else int(usage)
        if layout != REDIS:
            if not wrong_type:
                counted[layout] += 1
                if pttl != -2:  # else gone since SCAN saw it
                    values[key] = _Value(layout, cast("LMCacheKey | MPKey", parsed), int(size), pttl >= 0)
                    values[key].memory = usage
            continue
        chunk_key, kind = cast("tuple[LMCacheKey, str]", parsed)
        raw = next(metas_read) if kind == METADATA_SUFFIX else None
        if kind == KV_SUFFIX and wrong_type:
            continue
        counted[REDIS] += 1
        if pttl == -2 or (kind == METADATA_SUFFIX and raw is None and not wrong_type):
            continue  # gone since SCAN saw it
        chunk = chunks.get(base := key[:-len(kind)])
        if chunk is None:
            chunk = chunks[base] = _Chunk(chunk_key)
        if kind == KV_SUFFIX:
            chunk.kv_bytes = int(size)
        else:
            chunk.meta = raw if raw is not None else b""
        chunk.ttls += pttl >= 0
        if usage is not None:
            chunk.memory[kind] = usage
    return counted


def _sampled_memory(client, chunks: dict[bytes, _Chunk], values: dict[bytes, _Value], n: int) -> int:
    """MEMORY USAGE of ``n`` LMCache keys spread over the layouts' models, uniform within each; pipelined. Returns
    the number of keys sampled."""
    strata: dict[tuple[str, str], list[tuple[bytes, str]]] = defaultdict(list)
    for base, chunk in chunks.items():
        for kind, present in ((METADATA_SUFFIX, chunk.meta is not None), (KV_SUFFIX, chunk.kv_bytes is not None)):
            if present:
                strata[(REDIS, chunk.key.model_name)].append((base, kind))
    for key, value in values.items():
        strata[(value.layout, value.key.model_name)].append((key, ""))
    picks = []
    for (_, keys), take in zip(sorted(strata.items()), quotas([len(k) for _, k in sorted(strata.items())], n)):
        picks += [keys[i] for i in (_RNG.choice(len(keys), size=take, replace=False) if take < len(keys)
                                    else range(len(keys)))]
    pipe = client.pipeline(transaction=False)
    for base, kind in picks:
        pipe.memory_usage(base + kind.encode())
    for (base, kind), usage in zip(picks, execute_read(pipe) if picks else []):
        if usage is not None and kind:
            chunks[base].memory[kind] = int(usage)
        elif usage is not None:
            values[base].memory = int(usage)
    return len(picks)


def _value_groups(values: dict[bytes, _Value], layout: str) -> list[OneKeyGroup]:
    """Fold one one-key layout's keys into one group per model (:class:`OneKeyGroup`)."""
    groups: dict[str, OneKeyGroup] = {}
    for raw in sorted(values):
        v = values[raw]
        if v.layout != layout:
            continue
        key = v.key
        g = groups.get(key.model_name) or groups.setdefault(key.model_name, OneKeyGroup(layout, key.model_name))
        g.keys += 1
        g.value_bytes += v.size
        g.empty_values += v.size == 0
        g.keys_with_ttl += v.ttl
        g.by_value_bytes[v.size] += 1
        if isinstance(key, MPKey):
            world, rank, _, _ = split_kv_rank(key.kv_rank)
            g.by_world_size[world] += 1
            g.by_worker_id[rank] += 1
            g.by_kv_rank[f"{key.kv_rank:08x}"] += 1
            g.by_object_group[key.object_group_id] += 1
            g.by_hash_bytes[len(key.chunk_hash)] += 1
            if key.cache_salt:
                g.salted_keys += 1
                g._salts.add(key.cache_salt)
                g.salts = len(g._salts)
        else:
            g.by_world_size[key.world_size] += 1
            g.by_worker_id[key.worker_id] += 1
            g.by_dtype[key.dtype] += 1
            g.layerwise_keys += key.layer_id is not None
            for tag in key.tags:
                g.by_tag["%".join(tag)] += 1
        if v.memory is not None:
            g.memory_bytes = (g.memory_bytes or 0) + v.memory
            g.memory_sampled_keys += 1
        if g.example is None and v.size:
            g.example = _value_example(raw, v)
    for g in groups.values():
        if g.memory_bytes is not None and g.memory_sampled_keys < g.keys:
            g.memory_bytes = int(g.memory_bytes * g.keys / g.memory_sampled_keys)
    return [groups[m] for m in sorted(groups)]


def _value_example(raw: bytes, v: _Value) -> dict:
    """One key of a one-key layout spelled out: its fields and its value's size."""
    key = v.key
    if isinstance(key, MPKey):
        world, rank, local_world, local_rank = split_kv_rank(key.kv_rank)
        fields = {"model_name": key.model_name, "kv_rank": f"{key.kv_rank:08x}",
                  "kv_rank_fields": {"world_size": world, "global_rank": rank, "local_world_size": local_world,
                                     "local_rank": local_rank},
                  "object_group_id": key.object_group_id, "chunk_hash_hex": key.chunk_hash.hex(),
                  "salted": bool(key.cache_salt)}
    else:
        fields = {"model_name": key.model_name, "world_size": key.world_size, "worker_id": key.worker_id,
                  "chunk_hash_hex": f"{key.chunk_hash:x}", "dtype": key.dtype, "layer_id": key.layer_id,
                  "tags": dict(key.tags)}
    return {"key": raw.decode(errors="replace"), **fields, "value_bytes": v.size}


def _groups(chunks: dict[bytes, _Chunk]) -> list[LMCacheGroup]:
    """Fold the chunks' facts into one group per model (module docstring)."""
    groups: dict[str, LMCacheGroup] = {}
    for base in sorted(chunks):
        chunk = chunks[base]
        key = chunk.key
        g = groups.get(key.model_name) or groups.setdefault(key.model_name, LMCacheGroup(key.model_name))
        name = base.decode()
        g.by_world_size[key.world_size] += 1
        g.by_worker_id[key.worker_id] += 1
        g.by_dtype[key.dtype] += 1
        g.layerwise_chunks += key.layer_id is not None
        for tag in key.tags:
            g.by_tag["%".join(tag)] += 1
        g.keys_with_ttl += chunk.ttls
        if chunk.kv_bytes is not None:
            g.kv_keys += 1
            g.kv_value_bytes += chunk.kv_bytes
            if chunk.meta is None:
                g.issues["orphan_kv_bytes"].append(name)
        if chunk.meta is not None:
            _record(g, chunk, chunk.meta, name)
        for usage in chunk.memory.values():
            g.memory_bytes = (g.memory_bytes or 0) + usage
            g.memory_sampled_keys += 1
    for g in groups.values():
        keys = g.metadata_keys + g.kv_keys
        if g.memory_bytes is not None and g.memory_sampled_keys < keys:  # None: no key's memory was read
            g.memory_bytes = int(g.memory_bytes * keys / g.memory_sampled_keys)
    return [groups[m] for m in sorted(groups)]


def _record(g: LMCacheGroup, chunk: _Chunk, meta: bytes, name: str) -> None:
    """Account the chunk's metadata value ``meta``: decode it, check it against the kv bytes, keep the first complete
    chunk."""
    g.metadata_keys += 1
    g.metadata_value_bytes += len(meta)
    try:
        record = unpack_record(meta)
    except ValueError:
        g.issues["bad_metadata"].append(name)
        return
    g.by_format[record.fmt_name] += 1
    g.by_chunk_tokens[record.tokens] += 1
    g.by_shape["x".join(map(str, record.groups[0].shape))] += 1
    if chunk.kv_bytes is None:
        g.issues["orphan_metadata"].append(name)
    elif chunk.kv_bytes != record.length:
        g.issues["length_mismatch"].append(name)
    else:
        g.chunks += 1
        if g.example is None:
            g.example = _example(chunk.key, record, meta)


def _example(key: LMCacheKey, record: RemoteRecord, raw: bytes) -> dict:
    """One chunk spelled out: its key string parsed and its metadata record decoded."""
    return {"key": key.to_string(), "model_name": key.model_name, "world_size": key.world_size,
            "worker_id": key.worker_id, "chunk_hash_hex": f"{key.chunk_hash:x}", "dtype": key.dtype,
            "layer_id": key.layer_id, "tags": dict(key.tags),
            "metadata": {"hex": raw.hex(), "length_bytes": record.length, "format": record.fmt_name,
                         "chunk_tokens": record.tokens,
                         "groups": [{"dtype": str(gr.dtype).removeprefix("torch.") if gr.dtype else None,
                                     "dtype_code": gr.dtype_code, "shape": list(gr.shape)}
                                    for gr in record.groups]}}
