"""Read an LMCache Redis backend without touching it: its chunks by model, their metadata records, bytes, orphans
and memory.

The layout is LMCache 0.5.6's ``redis://`` connector (:mod:`kvcli.store.lmcache`): two keys per chunk,
``<key>metadata`` (a 28-byte record for one KV group) and ``<key>kv_bytes`` (the KV tensor bytes), where ``<key>``
is ``{model_name}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}[@{layer_id}][@{tag}%{value}...]``.

Strictly read-only, like :mod:`kvcli.live.inspect`: keys are listed with SCAN (never KEYS) over one ``CLIENT
NO-TOUCH`` connection (:func:`kvcli.live.reading.reader`); each SCAN step's reads go out in one round trip (MGET
of the metadata values and one EVAL_RO for every key's PTTL, STRLEN and MEMORY USAGE, or the same commands
pipelined where scripts are refused). KV bytes are never read: their size is STRLEN. Any key that is not
``<key>metadata`` or ``<key>kv_bytes`` with a key LMCache could have written (its dtype names, integer fields,
lower-case hex hash) is counted as "other" and nothing else is done with it; so is a ``kv_bytes`` key that does
not hold a string. Keys of LMCache 0.3.x's older layout (a leading ``{fmt}@`` field:
:func:`kvcli.store.lmcache.legacy_model`) are counted apart, by model, and not read either.

Per model (the key's ``model_name``):
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

import numpy as np
import redis
from redis.cluster import RedisCluster

from kvcli.live.inspect import SCAN_COUNT, ShardView, quotas, shard_skew, shard_views, shards_to_dict
from kvcli.live.reading import execute_read, read_key_facts, reader
from kvcli.store import cluster
from kvcli.store.lmcache import (
    KEY_FORMAT,
    KV_SUFFIX,
    LEGACY_KEY_FORMAT,
    LEGACY_VERSIONS,
    LMCACHE_COMMIT,
    LMCACHE_VERSION,
    METADATA_SUFFIX,
    LMCacheKey,
    RemoteRecord,
    legacy_model,
    split_redis_key,
    unpack_record,
)
from kvcli.store.preflight import ServerMemory, server_memory

ISSUE_KEYS_LISTED = 100
_RNG = np.random.default_rng()


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


@dataclass
class LMCacheInspection:
    """The whole read: server state, key counts (LMCache / LMCache 0.3.x's older layout / other), one group per
    model, how memory was read. ``legacy_models``: keys of the older layout per model name (not read further); a
    shard's ``other_keys`` counts them with the other keys."""

    server: ServerMemory
    scanned_keys: int = 0
    lmcache_keys: int = 0
    legacy_keys: int = 0
    other_keys: int = 0
    legacy_models: Counter = field(default_factory=Counter)
    groups: list[LMCacheGroup] = field(default_factory=list)
    memory_sampled: int | None = None  # None: MEMORY USAGE of every key; 0: not read; N: a sample of N keys
    seconds: float = 0.0
    no_touch: bool | None = None
    cluster: bool = False
    shards: list[ShardView] = field(default_factory=list)  # LMCache keys, other keys and INFO memory per primary

    @property
    def skew(self) -> dict:
        """Largest shard over the mean, of LMCache keys and of used_memory (None: nothing to compare)."""
        return shard_skew(self.shards, "lmcache")

    def to_dict(self) -> dict:
        """JSON-ready, with the layout and LMCache version matched."""
        return {"layout": {"name": "lmcache", "keys": KEY_FORMAT,
                           "matched": f"LMCache {LMCACHE_VERSION} (git {LMCACHE_COMMIT}), redis:// connector"},
                "server": self.server.to_dict(), "keys": {"scanned": self.scanned_keys, "lmcache": self.lmcache_keys,
                "lmcache_legacy": self.legacy_keys, "other": self.other_keys},
                "legacy_layout": {"keys": LEGACY_KEY_FORMAT, "matched": f"LMCache {LEGACY_VERSIONS}",
                                  "keys_by_model": dict(sorted(self.legacy_models.items()))},
                "memory_sampled_keys": self.memory_sampled, "no_touch": self.no_touch,
                "seconds": self.seconds, "cluster": self.cluster,
                "shards": shards_to_dict(self.shards, "lmcache", self.lmcache_keys), "skew": self.skew,
                "groups": [g.to_dict() for g in self.groups]}


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
        script = [not result.cluster]  # a script's keys must share a slot: per-key reads on a cluster
        for shard, keys in cluster.scan(conn, count=SCAN_COUNT):
            result.scanned_keys += len(keys)
            parsed_keys = [(key, split_redis_key(key)) for key in keys]
            mine = [(key, parsed) for key, parsed in parsed_keys if parsed is not None]
            foreign = _read_batch(conn, mine, chunks, sample is None, script) if mine else 0
            legacy = [model for key, parsed in parsed_keys if parsed is None and (model := legacy_model(key))]
            result.legacy_models.update(legacy)
            result.lmcache_keys += len(mine) - foreign
            result.legacy_keys += len(legacy)
            result.other_keys += len(keys) - len(mine) - len(legacy) + foreign
            views[shard].keys += len(mine) - foreign
            views[shard].other_keys += len(keys) - len(mine) + foreign
        if sample:
            result.memory_sampled = _sampled_memory(conn, chunks, sample)
        result.groups = _groups(chunks)
        result.seconds = time.perf_counter() - t0
        result.no_touch = bool(getattr(conn, "kvcli_no_touch", False))
    return result


def _read_batch(client, mine, chunks: dict[bytes, _Chunk], with_memory: bool, script: list[bool]) -> int:
    """One round trip per SCAN step (see the module docstring). Returns the kv_bytes-named keys that hold no
    string (the caller counts them as other keys)."""
    keys = [key for key, _ in mine]
    metas = [key for key, (_, kind) in mine if kind == METADATA_SUFFIX]
    meta_values, facts = read_key_facts(client, keys, metas, with_memory, script)
    values, width, foreign = iter(meta_values), 2 + with_memory, 0
    for i, (key, (parsed, kind)) in enumerate(mine):
        pttl, size = int(facts[width * i]), facts[width * i + 1]
        wrong_type = isinstance(size, Exception) or int(size) < 0
        raw = next(values) if kind == METADATA_SUFFIX else None
        if kind == KV_SUFFIX and wrong_type:
            foreign += 1
            continue
        if pttl == -2 or (kind == METADATA_SUFFIX and raw is None and not wrong_type):
            continue  # gone since SCAN saw it
        chunk = chunks.get(base := key[:-len(kind)])
        if chunk is None:
            chunk = chunks[base] = _Chunk(parsed)
        if kind == KV_SUFFIX:
            chunk.kv_bytes = int(size)
        else:
            chunk.meta = raw if raw is not None else b""
        chunk.ttls += pttl >= 0
        usage = facts[width * i + 2] if with_memory else None
        if usage is not None and not isinstance(usage, Exception):
            chunk.memory[kind] = int(usage)
    return foreign


def _sampled_memory(client, chunks: dict[bytes, _Chunk], n: int) -> int:
    """MEMORY USAGE of ``n`` LMCache keys spread over the models, uniform within each; pipelined. Returns the
    number of keys sampled."""
    strata: dict[str, list[tuple[bytes, str]]] = defaultdict(list)
    for base, chunk in chunks.items():
        for kind, present in ((METADATA_SUFFIX, chunk.meta is not None), (KV_SUFFIX, chunk.kv_bytes is not None)):
            if present:
                strata[chunk.key.model_name].append((base, kind))
    picks = []
    for (_, keys), take in zip(sorted(strata.items()), quotas([len(k) for _, k in sorted(strata.items())], n)):
        picks += [keys[i] for i in (_RNG.choice(len(keys), size=take, replace=False) if take < len(keys)
                                    else range(len(keys)))]
    pipe = client.pipeline(transaction=False)
    for base, kind in picks:
        pipe.memory_usage(base + kind.encode())
    for (base, kind), usage in zip(picks, execute_read(pipe) if picks else []):
        if usage is not None:
            chunks[base].memory[kind] = int(usage)
    return len(picks)


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
