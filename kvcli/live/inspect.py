"""Read a live cache without touching it: kvcli's keys by namespace, model and chunk size, and their integrity.

Strictly read-only: the only commands sent are those in :data:`READ_COMMANDS` (SCAN, MGET, GET, EXISTS, STRLEN,
PTTL, MEMORY USAGE, INFO, DBSIZE, and EVAL_RO, whose script the server forbids to write; plus CLIENT NO-TOUCH ON,
which only sets the connection's own mode); a test checks at the server that nothing else ran. It does not
change eviction state either, where the server allows it: every read goes over one dedicated connection
(:func:`reader`) that first sends ``CLIENT NO-TOUCH ON`` (Redis >= 7.2, Valkey), so the keys' LRU idle time and
LFU counters stay as they were; older servers refuse it, and their reads touch keys as any client's do.
Keys are listed with SCAN and a cursor (never KEYS); each SCAN step's reads go out in
one round trip (MGET of the metadata values plus one EVAL_RO for every key's PTTL, STRLEN and MEMORY USAGE, or,
where scripts are refused, the same commands pipelined one per key). Foreign keys (anything that is not
``kvcli:v1:{namespace}:{chunk_size}:{m|p}:{hash}``) are counted as "other" and nothing else is done with them; so
is a payload-named key that does not hold a string, while a metadata-named key that does not hold a string is
bad metadata. Keys of ``kvcli route``'s cache-manager indexes (:func:`kvcli.store.layout.is_route_index_key`) are
counted apart, as route index keys, and not read.

On a Redis Cluster every primary is scanned (after checking that the cluster serves all 16,384 slots: a shard
that is down or a slot nobody serves fails the command, exit 3, so a partial view is never presented as the whole),
over one NO-TOUCH connection per primary; keys of one SCAN step hash to many slots, so their reads go as per-key
GET, PTTL, STRLEN (and MEMORY USAGE) in one cluster pipeline per step (redis-py routes each key). Totals are the
whole cluster's; ``shards`` breaks kvcli keys, other keys and memory down per primary, with each one's share, and
``skew`` is the largest shard over the mean (1.0: even). A chunk's metadata and payload may sit on different
shards: integrity is computed over the union.

Integrity, per namespace and chunk size, by the one chunk judge (:mod:`kvcli.store.judge`):
  * orphan metadata: metadata whose payload is gone (a "real" chunk); orphan payloads: payload without metadata
    (both are left by eviction, expiry of one half, or a crash);
  * checksum failures: payloads whose tensor bytes no longer match the checksum in their metadata (verified when
    ``verify``; by default when the payloads total at most 256 MiB);
  * bad payloads: payloads of another length than their metadata's header + tensor bytes (truncated, overwritten),
    or a payload-named key of another type than a string;
  * other layout: chunks stored "real" in another payload layout (dtype, shape, payload or header bytes:
    :meth:`kvcli.store.judge.Expected.same_layout`) than chunk 0 of their chain (a chunk rewritten by a store of
    another ``--kv-dtype``): a store reads one layout, so its lookups stop there, as replay's do;
  * unreachable: chunks stored "real" whose chain back to chunk 0 is broken (an ancestor is missing, orphaned or
    corrupted, or the parent links loop) or changes layout on the way (the chunk itself or an ancestor is of
    another layout than the one before it), so no lookup can ever reach them. Metadata-only ("accounted") entries,
    written by replay, are not judged: they have no payload to reach, and their prefix may live in the namespace
    that replay read. The walk over parent links (read from the server, so possibly damaged) keeps a visited set
    and is bounded by the number of metadata entries: a chunk naming itself or a descendant as its parent ends the
    walk there, unreachable. A chunk can be in more than one list.

A payload key carries no model; it is grouped under the model of the metadata beside it (same hash), or, for an
orphan payload, under the namespace's one model ("?" when the namespace holds several).
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import redis
from redis.cluster import RedisCluster

from kvcli.live.reading import execute_read, read_key_facts, reader
from kvcli.store import cluster
from kvcli.store.judge import BAD_METADATA, BAD_PAYLOAD, CHECKSUM, HITS, NO_PAYLOAD, WRONG_TYPE, Expected, judge
from kvcli.store.layout import ChunkMeta, is_chunk_key, is_route_index_key, key_prefix, parse_key, parse_or_none
from kvcli.store.preflight import ServerMemory, server_memory

VERIFY_AUTO_BYTES = 256 << 20
_FOREIGN = ("", -1)  # a key shaped like kvcli's whose namespace kvcli could not have written (not UTF-8)
SCAN_COUNT = 1000
_RNG = np.random.default_rng()


def spread(values: list[float]) -> dict:
    """``{"min", "median", "max"}`` of a list (None each when empty)."""
    if not values:
        return {"min": None, "median": None, "max": None}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


@dataclass
class Group:
    """One (namespace, model, chunk size): counts, bytes, Redis memory (extrapolated when sampled), TTLs (seconds),
    ages (seconds since ``created``) and integrity counts. ``model`` is "?" for orphan payloads it cannot name."""

    namespace: str
    model: str
    chunk_size: int
    chunks: int = 0
    metadata_entries: int = 0
    payload_objects: int = 0
    payload_bytes: int = 0
    metadata_bytes: int = 0
    memory_bytes: int | None = None  # None: not measured (--sample 0, or no key of this group in the sample)
    memory_keys: int = 0
    ttl_none: int = 0
    ttls: list[float] = field(default_factory=list)
    ages: list[float] = field(default_factory=list)
    issues: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def to_dict(self, keys: bool = True) -> dict:
        """JSON-ready; ``keys`` lists the integrity problems' chunk hashes, else only their counts."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("ttls", "ages", "issues", "model")}
        out["model_id"] = self.model
        out["ttl_seconds"] = {"none": self.ttl_none, "with_ttl": len(self.ttls), **spread(self.ttls)}
        out["age_seconds"] = spread(self.ages)
        out["integrity"] = {name: (sorted(v) if keys else len(v)) for name, v in self.issues.items()}
        return out


@dataclass
class ShardView:
    """One primary (the server itself when not a cluster): the inspected layout's keys (kvcli's, or LMCache's) and
    other keys seen by its SCAN, its INFO ``used_memory`` and ``maxmemory`` (bytes), and MEMORY USAGE of its layout
    keys (bytes; None unless every key was read)."""

    name: str
    keys: int = 0
    other_keys: int = 0
    used_memory: int | None = 0  # None: this user may not run INFO
    maxmemory: int | None = 0
    memory_bytes: int | None = None

    def to_dict(self, layout: str, total: int, used_total: int) -> dict:
        """JSON-ready under the layout's names (``{layout}_keys``, ``{layout}_memory_bytes``), with
        ``{layout}_keys_share`` and ``used_memory_share`` (0..1 of the cluster's; None when INFO was refused)."""
        return {"name": self.name, f"{layout}_keys": self.keys, "other_keys": self.other_keys,
                "used_memory": self.used_memory, "maxmemory": self.maxmemory,
                f"{layout}_memory_bytes": self.memory_bytes,
                f"{layout}_keys_share": self.keys / total if total else 0.0,
                "used_memory_share": None if self.used_memory is None else
                self.used_memory / used_total if used_total else 0.0}


def shard_views(client, server: ServerMemory, memory: bool) -> list[ShardView]:
    """One empty :class:`ShardView` per primary of ``client`` (the server itself when not a cluster), with the INFO
    figures of ``server`` (:func:`kvcli.store.preflight.server_memory`); ``memory``: MEMORY USAGE will be summed."""
    facts = {f.name: f for f in server.shards}
    return [ShardView(name, used_memory=facts.get(name, server).used_memory,
                      maxmemory=facts.get(name, server).maxmemory, memory_bytes=0 if memory else None)
            for name, _ in cluster.shards(client)]


def shard_skew(shards: list[ShardView], layout: str) -> dict:
    """Largest shard over the mean, of the layout's keys and of used_memory (None: nothing to compare)."""
    return {f"{layout}_keys": skew([s.keys for s in shards]), "used_memory": skew([s.used_memory for s in shards])}


def shards_to_dict(shards: list[ShardView], layout: str, total: int) -> list[dict]:
    """Each shard's :meth:`ShardView.to_dict` with shares of ``total`` layout keys and of the summed used_memory."""
    used = sum(s.used_memory or 0 for s in shards)
    return [s.to_dict(layout, total, used) for s in shards]


def skew(values: list[int | None]) -> float | None:
    """The largest over the mean (1.0: even; N shards with everything on one: N). None for no values, all 0, or a
    value not read."""
    known = [v for v in values if v is not None]
    if len(known) < len(values):
        return None
    total = sum(known)
    return max(known) * len(known) / total if known and total else None


@dataclass
class Inspection:
    """The whole read: server state, key counts (kvcli chunks / route index / other), groups, and how memory and
    checksums were read. A shard's ``other_keys`` counts route index keys with the other keys."""

    server: ServerMemory
    scanned_keys: int = 0
    kvcli_keys: int = 0
    route_index_keys: int = 0
    other_keys: int = 0
    groups: list[Group] = field(default_factory=list)
    memory_sampled: int | None = None  # None: MEMORY USAGE of every kvcli key; 0: not read; N: a sample of N
    verified: bool = False
    seconds: float = 0.0
    no_touch: bool | None = None  # the server accepted CLIENT NO-TOUCH ON (reads left LRU/LFU state alone)
    cluster: bool = False
    shards: list[ShardView] = field(default_factory=list)

    @property
    def skew(self) -> dict:
        """Largest shard over the mean, of kvcli keys and of used_memory (None: nothing to compare)."""
        return shard_skew(self.shards, "kvcli")

    def to_dict(self) -> dict:
        """JSON-ready, integrity problems listed by chunk hash."""
        server = {k: v for k, v in self.server.__dict__.items() if k != "shards"}
        return {"server": server, "keys": {"scanned": self.scanned_keys, "kvcli": self.kvcli_keys,
                "route_index": self.route_index_keys, "other": self.other_keys},
                "memory_sampled_keys": self.memory_sampled, "checksums_verified": self.verified,
                "no_touch": self.no_touch, "seconds": self.seconds, "cluster": self.cluster,
                "shards": shards_to_dict(self.shards, "kvcli", self.kvcli_keys), "skew": self.skew,
                "groups": [g.to_dict() for g in self.groups]}


class _Space:
    """Raw per-key facts of one (namespace, chunk size), gathered during the scan."""

    def __init__(self) -> None:
        self.meta: dict[str, tuple[ChunkMeta | None, int, int]] = {}  # hash -> (parsed, value bytes, pttl ms)
        self.payload: dict[str, tuple[int, int]] = {}  # hash -> (value bytes, pttl ms)
        self.memory: dict[tuple[str, str], int] = {}  # (kind, hash) -> MEMORY USAGE bytes
        self.bad_checksum: set[str] = set()
        self.odd_payloads: set[str] = set()  # payload-named keys that hold another type (counted as other keys)


def inspect_cache(client: redis.Redis | RedisCluster, namespace: str | None = None, sample: int | None = None,
                  verify: bool | None = None) -> Inspection:
    """Read every kvcli key once (read-only, over one NO-TOUCH connection: :func:`reader`) and summarise it.

    Args:
        namespace: only this namespace's keys are read (others still count in ``kvcli_keys``).
        sample: MEMORY USAGE of every kvcli key (None), of none (0), or of N keys spread over the groups (one per
            group when N >= the number of groups, the rest in proportion to the groups' key counts), each group's
            reading scaled up to its key count.
        verify: read payloads to check their checksums (None: only when they total <= 256 MiB).

    Raises:
        RedisFailure: the server refused a read.
    """
    with reader(client) as conn:
        result = _inspect(conn, namespace, sample, verify)
        result.no_touch = bool(getattr(conn, "kvcli_no_touch", False))
    return result


def _inspect(client: redis.Redis | RedisCluster, namespace: str | None, sample: int | None,
             verify: bool | None) -> Inspection:
    t0 = time.perf_counter()
    is_cluster = cluster.is_cluster(client)
    cluster.check_whole(client)  # before INFO: a cluster that is not whole is refused, not summed
    result = Inspection(server_memory(client), memory_sampled=sample, cluster=is_cluster)
    result.shards = shard_views(client, result.server, sample is None)
    views = {v.name: v for v in result.shards}
    spaces: dict[tuple[str, int], _Space] = defaultdict(_Space)
    script = [not is_cluster]  # a script's keys must share a slot: per-key reads on a cluster
    heads: dict[bytes, tuple | None] = {}  # "kvcli:v1:{ns}:{cs}" -> (ns, cs), or None when filtered out
    for shard, keys in cluster.scan(client, count=SCAN_COUNT):
        view = views[shard]
        result.scanned_keys += len(keys)
        mine = []
        for key in keys:
            parts = _split(key)
            if parts is None:
                if is_route_index_key(key):
                    result.route_index_keys += 1
                else:
                    result.other_keys += 1
                view.other_keys += 1
                continue
            result.kvcli_keys += 1
            view.keys += 1
            head = heads.get(parts[0], 0)
            if head == 0:
                full = parse_key(key)
                if full is None:  # a namespace that is not UTF-8 text: not a key kvcli writes
                    head = heads[parts[0]] = _FOREIGN
                else:
                    head = heads[parts[0]] = ((full.namespace, full.chunk_size)
                                              if namespace is None or full.namespace == namespace else None)
            if head is _FOREIGN:
                result.kvcli_keys -= 1
                result.other_keys += 1
            elif head is not None:
                mine.append((key, head, parts[1], parts[2]))
        if mine:
            foreign = _read_batch(client, mine, spaces, sample is None, script, view)
            result.kvcli_keys -= foreign
            result.other_keys += foreign
            view.keys -= foreign
            view.other_keys += foreign
    if sample:
        result.memory_sampled = _sampled_memory(client, spaces, sample)
    payload_total = sum(n for s in spaces.values() for n, _ in s.payload.values())
    result.verified = verify if verify is not None else payload_total <= VERIFY_AUTO_BYTES
    for (ns, cs), space in sorted(spaces.items()):
        if result.verified:
            _verify(client, ns, cs, space)
        result.groups.extend(_groups(ns, cs, space, sample))
    result.seconds = time.perf_counter() - t0
    return result


def _split(key: bytes) -> tuple[bytes, str, str] | None:
    """``(b"kvcli:v1:{ns}:{cs}", kind, hash hex)`` of a kvcli chunk key, else None (store.parse_key's rules)."""
    if not is_chunk_key(key):
        return None
    head, kind, h = key.rsplit(b":", 2)
    return head, kind.decode(), h.decode()


def _read_batch(client, mine, spaces, with_memory: bool, script: list[bool], view: ShardView) -> int:
    """One round trip per SCAN step: MGET of the metadata values, and each key's PTTL, STRLEN (and MEMORY USAGE)
    in one EVAL_RO, or pipelined one by one where scripts are refused (``script[0]`` is set False then). On a
    cluster: every read per key (GET for metadata), in one cluster pipeline; MEMORY USAGE adds to ``view``.

    A key that holds no string (STRLEN: WRONGTYPE): metadata-named, it is bad metadata (size 0); payload-named, it
    is not a payload. Returns the number of the latter (the caller counts them as other keys)."""
    keys = [m[0] for m in mine]
    metas = [m[0] for m in mine if m[2] == "m"]
    meta_values, facts = read_key_facts(client, keys, metas, with_memory, script)
    values, width, foreign = iter(meta_values), 2 + with_memory, 0
    for i, (_, head, kind, h) in enumerate(mine):
        space = spaces[head]
        pttl, size = int(facts[width * i]), facts[width * i + 1]
        wrong_type = isinstance(size, Exception) or int(size) < 0
        if kind == "p":
            if wrong_type:
                foreign += 1
                space.odd_payloads.add(h)
                continue
            if pttl != -2:  # -2: gone since SCAN saw it
                space.payload[h] = (int(size), pttl)
        else:
            raw = next(values)
            if raw is not None:
                space.meta[h] = (parse_or_none(raw), len(raw), pttl)
            elif wrong_type and pttl != -2:  # MGET answers nil for a key of another type
                space.meta[h] = (None, 0, pttl)
        if with_memory and facts[width * i + 2] is not None and not isinstance(facts[width * i + 2], Exception):
            space.memory[(kind, h)] = int(facts[width * i + 2])
            view.memory_bytes = (view.memory_bytes or 0) + int(facts[width * i + 2])
    return foreign


def _strata(space: _Space) -> dict[str, list[tuple[str, str]]]:
    """One space's keys ``(kind, hash)`` by the group (model) :func:`_groups` puts them in."""
    out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for h, (meta, _, _) in space.meta.items():
        out[meta.model if meta else "?"].append(("m", h))
    lone = _lone_model(space)
    for h in space.payload:
        out[_payload_model(space, h, lone)].append(("p", h))
    return out


def _lone_model(space: _Space) -> str:
    """The namespace's one model (for orphan payloads), or "?" when it holds several or none."""
    models = {m.model for m, _, _ in space.meta.values() if m}
    return next(iter(models)) if len(models) == 1 else "?"


def _payload_model(space: _Space, h: str, lone: str) -> str:
    """A payload's model: that of the metadata beside it (same hash), else the namespace's one model."""
    entry = space.meta.get(h)
    return entry[0].model if entry is not None and entry[0] is not None else lone


def quotas(sizes: list[int], n: int) -> list[int]:
    """How many of each group's keys to sample, ``n`` in all: every key when ``n`` covers them; else one per group
    (the largest groups first when ``n`` is smaller than the number of groups), the rest in proportion to the
    groups' sizes beyond that first key (largest remainders). Never more than a group holds."""
    total = sum(sizes)
    if n >= total:
        return list(sizes)
    if n <= len(sizes):
        order = sorted(range(len(sizes)), key=lambda i: -sizes[i])[:n]
        return [int(i in order) for i in range(len(sizes))]
    rest, spare = n - len(sizes), total - len(sizes)
    exact = [rest * (s - 1) / spare for s in sizes]
    out = [1 + int(e) for e in exact]
    for i in sorted(range(len(sizes)), key=lambda i: int(exact[i]) - exact[i])[:n - sum(out)]:
        out[i] += 1
    return out


def _sampled_memory(client, spaces, n: int) -> int:
    """MEMORY USAGE of ``n`` kvcli keys spread over the groups (:func:`quotas`), uniform within each; pipelined.
    Returns the number of keys sampled."""
    strata = [((ns, cs), kind_hashes) for (ns, cs), space in sorted(spaces.items())
              for _, kind_hashes in sorted(_strata(space).items())]
    picks = []
    for ((ns, cs), keys), take in zip(strata, quotas([len(k) for _, k in strata], n)):
        for i in sorted(_RNG.choice(len(keys), size=take, replace=False)) if take < len(keys) else range(len(keys)):
            picks.append(((ns, cs), keys[i]))
    pipe = client.pipeline(transaction=False)
    for (ns, cs), (kind, h) in picks:
        pipe.memory_usage(f"{key_prefix(ns, cs)}{kind}:{h}")
    for ((ns, cs), (kind, h)), usage in zip(picks, execute_read(pipe) if picks else []):
        if usage is not None:
            spaces[(ns, cs)].memory[(kind, h)] = int(usage)
    return len(picks)


def _verify(client, ns: str, cs: int, space: _Space, batch_bytes: int = 1 << 20) -> None:
    """GET the payloads that have metadata, in pipelines of about ``batch_bytes`` (small: reply buffers count in
    the server's used_memory, and a full LRU cache evicts to make room for them), and check each checksum."""
    prefix = key_prefix(ns, cs)
    todo = [h for h, (meta, _, _) in space.meta.items() if meta and meta.stored == "real" and h in space.payload]
    start = 0
    while start < len(todo):
        pipe, size, end = client.pipeline(transaction=False), 0, start
        while end < len(todo) and (end == start or size < batch_bytes):
            pipe.get(f"{prefix}p:{todo[end]}")
            size, end = size + space.payload[todo[end]][0], end + 1
        for h, value in zip(todo[start:end], execute_read(pipe)):
            if value is not None and judge(space.meta[h][0], value) == CHECKSUM:
                space.bad_checksum.add(h)
        start = end


def _groups(ns: str, cs: int, space: _Space, sample: int | None) -> list[Group]:
    """Fold one space's facts into groups by model, with integrity (see the module docstring)."""
    now = time.time()
    groups: dict[str, Group] = {}

    def group(model: str) -> Group:
        return groups.setdefault(model, Group(ns, model, cs))

    lone = _lone_model(space)
    states = {h: _state(space, h) for h in space.meta}
    chains = _chains(space, lambda h: states.get(h) in HITS)
    g = None
    for h, (meta, size, pttl) in space.meta.items():
        model = meta.model if meta else "?"
        if g is None or g.model != model:
            g = group(model)
        g.metadata_entries += 1
        g.metadata_bytes += size
        _ttl(g, pttl)
        state = states[h]
        if state == BAD_METADATA or meta is None:  # meta None: not parsed, so bad metadata
            g.issues["bad_metadata"].append(h)
            continue
        g.chunks += state in HITS
        if meta.created is not None:
            g.ages.append(max(0.0, now - meta.created))
        if state in _ISSUES:
            g.issues[_ISSUES[state]].append(h)
        reachable, root = chains[h]
        if meta.stored == "real" and root is not None and not root.same_layout(meta):
            g.issues["other_layout"].append(h)
        if meta.stored == "real" and not reachable:
            g.issues["unreachable"].append(h)
    for h, (size, pttl) in space.payload.items():
        g = group(_payload_model(space, h, lone))
        g.payload_objects += 1
        g.payload_bytes += size
        _ttl(g, pttl)
        if h not in space.meta:
            g.issues["orphan_payloads"].append(h)
    _memory(groups, space, lone)
    return [groups[m] for m in sorted(groups)]


_ISSUES = {NO_PAYLOAD: "orphan_metadata", BAD_PAYLOAD: "bad_payload", CHECKSUM: "checksum_failures"}


def _state(space: _Space, h: str) -> str:
    """A metadata entry's chunk state (:func:`kvcli.store.judge.judge`): its payload's length as read (the value's
    length against the metadata's header + payload bytes), "checksum" when its bytes were verified and failed."""
    meta = space.meta[h][0]
    if meta is None:
        return BAD_METADATA
    if h in space.bad_checksum:
        return CHECKSUM
    payload = space.payload[h][0] if h in space.payload else WRONG_TYPE if h in space.odd_payloads else None
    return judge(meta, payload)


def _ttl(g: Group, pttl: int) -> None:
    if pttl < 0:
        g.ttl_none += 1
    else:
        g.ttls.append(pttl / 1000)


def _chains(space: _Space, intact) -> dict[str, tuple[bool, Expected | None]]:
    """For each metadata entry: ``(reachable, root)``. ``root``: the payload layout of chunk 0 of its chain
    (:meth:`kvcli.store.judge.Expected.of`), or None where the chain is broken before chunk 0 (a missing, orphaned
    or corrupted ancestor: ``intact`` says which are whole) or loops. ``reachable``: every ancestor is intact and
    each chunk from chunk 0 down to this one is of the layout of the one before it, so a lookup by the store that
    wrote chunk 0 can reach it. Iterative, with a visited set (the links come from the server: a chunk may name
    itself or a descendant as its parent) and a depth bound (no chain is longer than the number of entries): a loop
    makes every chunk on it unreachable."""
    memo: dict[str, tuple[bool, Expected | None]] = {}
    bound = len(space.meta)
    for start in space.meta:
        path: list[str] = []  # from ``start`` up, each the child of the next; the last one's parent is in memo
        on_path: set[str] = set()
        h = start
        while h not in memo:
            if h in on_path or len(path) > bound:  # the parent links loop: no chain from chunk 0 leads here
                memo.update((p, (False, None)) for p in path)
                break
            meta = space.meta[h][0]
            if meta is None or not meta.parent or not intact(meta.parent):
                root = Expected.of(meta) if meta is not None and not meta.parent else None  # chunk 0 of a chain
                memo[h] = (root is not None, root)
                break
            path.append(h)
            on_path.add(h)
            h = meta.parent
        for p in reversed(path):
            if p in memo:  # a loop, settled above
                continue
            meta = space.meta[p][0]
            assert meta is not None  # a path holds parsed entries only
            parent = space.meta[meta.parent][0]
            reached, root = memo[meta.parent]
            memo[p] = (reached and parent is not None and Expected.of(parent).same_layout(meta), root)
    return memo


def _memory(groups: dict[str, Group], space: _Space, lone: str) -> None:
    """Attribute MEMORY USAGE readings to groups; a sample is scaled up to the group's key count."""
    for (kind, h), usage in space.memory.items():
        entry = space.meta.get(h)
        model = (entry[0].model if entry and entry[0] else "?") if kind == "m" else _payload_model(space, h, lone)
        if model in groups:
            groups[model].memory_bytes = (groups[model].memory_bytes or 0) + usage
            groups[model].memory_keys += 1
    for g in groups.values():
        keys = g.metadata_entries + g.payload_objects
        if g.memory_keys and g.memory_keys < keys:
            g.memory_bytes = int((g.memory_bytes or 0) * keys / g.memory_keys)
