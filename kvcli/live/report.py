"""Reports of the live-cache commands: rich views for the terminal (warm, inspect, a prompt's chunk map, an LMCache
backend, purge) and one JSON document for scripts.

A view takes a command's result and returns what to print (a rich ``Group`` of tables and text, or one ``Text``);
:func:`print_view` prints it without cutting a cell. Every title and cell is plain text: names read from the
server (namespaces, models) are never parsed as rich markup.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcli.tables import print_table
from kvcli.units import fmt_bytes, json_document

if TYPE_CHECKING:
    from kvcli.live.chunkmap import ChunkMap
    from kvcli.live.inspect import Inspection
    from kvcli.live.inspect_lmcache import LMCacheInspection
    from kvcli.live.warm import WarmResult
    from kvcli.store.namespace import PurgeCount


def to_json(command: str, result) -> str:
    """``result`` as the command's JSON document (:func:`kvcli.units.json_document`): a result's ``to_dict`` (a
    dataclass's fields when it has none); a list of chunk maps under ``"chunk_maps"``."""
    body = _jsonable(result)
    return json_document(command, {"chunk_maps": body} if isinstance(body, list) else body, indent=1)


def _jsonable(obj):
    if isinstance(obj, list):
        return [_jsonable(x) for x in obj]
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return dataclasses.asdict(obj)


def print_view(console: Console, shown: RenderableType) -> None:
    """Print a view on ``console``: each table split by columns when too wide, never cut (its first
    :attr:`PlainTable.keep_columns`, default 1, repeated in each part: the columns that name a row); text unwrapped
    when ``console`` is not a terminal (a grep finds a line whole)."""
    for part in getattr(shown, "renderables", [shown]):
        if isinstance(part, Table):
            print_table(console, part, keep=getattr(part, "keep_columns", 1))
        else:
            console.print(part, soft_wrap=isinstance(part, Text) and not console.is_terminal)


class PlainTable(Table):
    """A rich table that knows how many of its first columns name a row (:func:`print_view` repeats them in each
    part of a table split by columns)."""

    keep_columns = 1


def plain_table(title: str, columns: list[str], rows: list[list]) -> PlainTable:
    """A table whose title and cells are plain text: names from the server (namespaces, models) are never read as
    rich markup (``[/]`` would raise, ``[p]`` would vanish). Integers get thousands separators; the first column is
    left-aligned, the others right-aligned."""
    table = PlainTable(title=Text(title), title_justify="left")
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(Text(f"{x:,}" if isinstance(x, int) else str(x)) for x in row))
    return table


def warm_view(r: WarmResult) -> Group:
    """``kvcli warm``: one row per chunk size (prompts, full chunks, written, present, objects, bytes), then what
    was written (or would be, in a dry run), repairs, the preflight, evictions and why the run stopped."""
    rows = [[t.chunk_size, t.prompts, t.full_chunks, t.chunks_written, t.chunks_present, t.objects_written,
             fmt_bytes(t.payload_bytes + t.header_bytes), fmt_bytes(t.metadata_bytes)] for t in r.per_size]
    verb = "would write" if r.dry_run else "wrote"
    note = (f"{verb} {r.total('objects_written'):,} objects, {fmt_bytes(r.total('bytes'))}" + _why_nothing(r)
            + ("" if r.dry_run else f"; prefilled {r.tokens_prefilled:,} tokens, reused {r.tokens_reused:,} "
               f"(model {r.compute_seconds:.2f} s, writes {r.write_seconds:.2f} s)") + f"; {r.seconds:.2f} s"
            + _repairs(r) + f"\npreflight: {r.preflight.message}"
            + ("" if not r.evicted_keys else f"\nevicted: the server evicted {r.evicted_keys:,} keys during this "
               f"warm; what was written may already be gone")
            + (f"\nstopped: {r.stopped}" if r.stopped else ""))
    where = "" if r.layout == "kvcli" else f" in LMCache's {r.layout} layout"
    table = plain_table(f"warm {r.namespace} ({r.model_id}){where}{' — dry run' if r.dry_run else ''}",
                        ["chunk size", "prompts", "full chunks", "written", "present", "objects", "payload",
                         "metadata"], rows)
    return Group(table, Text(note))


def _repairs(r: WarmResult) -> str:
    """Damaged chunks found (and rewritten) and TTLs refreshed along chains, when any."""
    repaired, refreshed = r.total("chunks_repaired"), r.total("ttl_refreshed")
    verb = "would rewrite" if r.dry_run else "rewrote"
    return ((f"\ndamaged: {verb} {repaired:,} chunks found damaged (missing half, wrong length, type, digest or "
             f"parent{', checksum' if r.verify else ''})" if repaired else "")
            + (f"\nttl: refreshed {refreshed:,} chunks a longer chain now depends on (a head never expires before "
               f"its tail)" if refreshed else ""))


def _why_nothing(r: WarmResult) -> str:
    """Why nothing was written, when nothing was and nothing failed: no prompts, no full chunk, all present."""
    if r.total("objects_written") or r.stopped:
        return ""
    if not r.prompts:
        return ": no prompts"
    if not r.total("full_chunks"):
        return ": no prompt is as long as a chunk"
    return ": everything was already present"


def inspect_view(r: Inspection) -> Group:
    """``kvcli inspect``: one row per namespace, model and chunk size (chunks, objects, bytes, memory, TTLs, age,
    integrity), a cluster's primaries, then the server's memory facts and how the keys were read."""
    s = r.server
    rows = []
    for g in r.groups:
        d = g.to_dict(keys=False)
        ttl, age = d["ttl_seconds"], d["age_seconds"]
        rows.append([g.namespace, g.model, g.chunk_size, g.chunks, g.metadata_entries, g.payload_objects,
                     fmt_bytes(g.payload_bytes), fmt_bytes(g.metadata_bytes), fmt_bytes(g.memory_bytes),
                     f"{ttl['none']:,} none" + (f"; {ttl['min']:.0f}/{ttl['median']:.0f}/{ttl['max']:.0f} s"
                                                 if ttl["with_ttl"] else ""),
                     "–" if age["median"] is None else f"{age['median']:.0f} s",
                     ", ".join(f"{k} {v:,}" for k, v in d["integrity"].items() if v) or "ok"])
    from kvcli.store.layout import ROUTE_NAMESPACE

    route = (f"; route index keys: {r.route_index_keys:,} (kvcli purge --namespace {ROUTE_NAMESPACE})"
             if r.route_index_keys else "")
    table = plain_table(f"kvcli keys: {r.kvcli_keys:,}{route}; other keys: {r.other_keys:,}",
                        ["namespace", "model", "chunk", "chunks", "metadata", "payloads", "payload", "meta bytes",
                         "redis memory", "ttl min/med/max", "age med", "integrity"], rows)
    table.keep_columns = 3  # namespace, model and chunk size name a row
    memory = ("every key" if r.memory_sampled is None else "not read" if r.memory_sampled == 0
              else f"sampled {r.memory_sampled:,} keys across the groups, scaled")
    maxmemory = fmt_bytes(s.maxmemory) if s.maxmemory else "none"
    server = (f"server {s.version}: used_memory {fmt_bytes(s.used_memory)}, maxmemory {maxmemory} ({s.policy}), "
              f"evicted_keys {s.evicted_keys:,}, expired_keys {s.expired_keys:,}" if s.known else f"server: {s.note}")
    parts: list[RenderableType] = [table]
    if r.cluster:
        parts.append(shards_table(r.shards, "kvcli", r.kvcli_keys, r.skew))
        server = "cluster totals, " + server
    return Group(*parts, Text(f"{server}; "
                             f"MEMORY USAGE: {memory}; checksums "
                             f"{'verified' if r.verified else 'not verified (--verify)'}; "
                             f"{'CLIENT NO-TOUCH' if r.no_touch else 'reads touched keys (no CLIENT NO-TOUCH)'}; "
                             f"{r.seconds:.2f} s"))


def shards_table(shards, layout: str, total: int, skew: dict) -> Table:
    """A cluster's primaries: the layout's keys ("kvcli" or "lmcache") and their share of ``total``, other keys,
    used_memory and its share, MEMORY USAGE of the layout's keys (kvcli's: read per shard; LMCache's is read per
    model, so no column), maxmemory; the ``skew`` (largest / mean) in the title."""
    used = sum(v.used_memory or 0 for v in shards)
    per_shard_memory = layout == "kvcli"
    rows = [[v.name, v.keys, f"{100 * v.keys / total if total else 0:.1f}%", v.other_keys, fmt_bytes(v.used_memory),
             f"{100 * (v.used_memory or 0) / used if used else 0:.1f}%"]
            + (["-" if v.memory_bytes is None else fmt_bytes(v.memory_bytes)] if per_shard_memory else [])
            + [fmt_bytes(v.maxmemory) if v.maxmemory else "none"] for v in shards]
    label = "kvcli" if layout == "kvcli" else "LMCache"
    return plain_table(f"Redis Cluster: {len(shards)} primaries, all scanned; skew (largest / mean): {label} keys "
                       f"{_times(skew[f'{layout}_keys'])}, used_memory {_times(skew['used_memory'])}",
                       ["primary", f"{label} keys", "share", "other keys", "used_memory", "share"]
                       + ([f"{label} MEMORY USAGE"] if per_shard_memory else []) + ["maxmemory"], rows)


def _times(value: float | None) -> str:
    """A ratio as ``1.25x``; "-" when unknown."""
    return "-" if value is None else f"{value:.2f}x"


def lmcache_view(r: LMCacheInspection) -> Group:
    """``kvcli inspect --layout lmcache``: the LMCache layouts found, named; then per layout one row per model
    (``redis://``: chunks, keys, bytes, memory, the commonest chunk lengths, formats, dtypes, world sizes,
    integrity; the one-key layouts: keys, value bytes and sizes, memory, what the keys say, empty values); the
    unknown and older layouts' keys; a cluster's primaries; then the server facts."""
    from kvcli.store.lmcache import KEY_FORMAT, LEGACY_KEY_FORMAT, LEGACY_VERSIONS, LMCACHE_VERSION, MP, RESP

    def top(counter) -> str:  # the 3 commonest values, with their counts when there is more than one
        common = counter.most_common(3)
        return ", ".join(f"{k}" if len(counter) == 1 else f"{k} ({n:,})" for k, n in common) or "-"

    short = {"orphan_metadata": "orphan meta", "orphan_kv_bytes": "orphan kv", "bad_metadata": "bad meta",
             "length_mismatch": "bad length"}
    rows = [[g.model_name, g.chunks, f"{g.metadata_keys:,} / {g.kv_keys:,}", fmt_bytes(g.kv_value_bytes),
             fmt_bytes(g.metadata_value_bytes), "-" if g.memory_bytes is None else fmt_bytes(g.memory_bytes),
             top(g.by_chunk_tokens), top(g.by_format), top(g.by_dtype),
             f"{top(g.by_world_size)} / {len(g.by_worker_id):,}",
             ", ".join(f"{short[k]} {len(v):,}" for k, v in sorted(g.issues.items())) or "ok"] for g in r.groups]
    names = {"lmcache": "redis:// (lmcache)", RESP: "resp:// (lmcache-resp)", MP: "multiprocess (lmcache-mp)",
             "legacy": f"LMCache {LEGACY_VERSIONS} older layout", "unknown": "UNKNOWN LMCache layout"}
    found = ", ".join(f"{names[x['name']]} {x['keys']:,} keys" for x in r.layouts()) or "none"
    legacy = f"; LMCache {LEGACY_VERSIONS} keys (older layout): {r.legacy_keys:,}" if r.legacy_keys else ""
    parts: list[RenderableType] = [Text(f"LMCache layouts: {found}")]
    if r.groups or not (r.resp_groups or r.mp_groups):
        parts.append(plain_table(f"LMCache keys: {r.lmcache_keys:,}{legacy}; other keys: {r.other_keys:,}",
                                 ["model", "chunks", "keys meta / kv", "kv bytes", "meta bytes", "redis memory",
                                  "tokens/chunk", "format", "dtype", "world size / workers", "integrity"], rows))
    for layout, groups, title in ((RESP, r.resp_groups, "resp://"), (MP, r.mp_groups, "multiprocess")):
        if not groups:
            continue
        keyed = (lambda g: top(g.by_dtype)) if layout == RESP else (
            lambda g: f"{top(g.by_object_group)} / {top(g.by_hash_bytes)} B / {g.salted_keys:,} ({g.salts:,})")
        parts.append(plain_table(
            f"LMCache {title} keys ({layout}): {sum(g.keys for g in groups):,}; one key per chunk, no metadata",
            ["model", "keys", "value bytes", "value sizes", "redis memory", "world size / workers",
             "dtype" if layout == RESP else "object groups / hash / salted (salts)", "integrity"],
            [[g.model_name, g.keys, fmt_bytes(g.value_bytes), top(g.by_value_bytes),
              "-" if g.memory_bytes is None else fmt_bytes(g.memory_bytes),
              f"{top(g.by_world_size)} / {len(g.by_worker_id):,}", keyed(g),
              f"empty values {g.empty_values:,}" if g.empty_values else "ok"] for g in groups]))
    if r.cluster:
        parts.append(shards_table(r.shards, "lmcache", r.known_keys, r.skew))
    if r.unknown.keys:
        firsts = ", ".join(f"{m} ({n:,})" for m, n in r.unknown.by_first_field.most_common(5))
        parts.append(Text(f"unknown LMCache layout: {r.unknown.keys:,} keys look like LMCache's (@ fields, a hex "
                          f"hash) but match none of the layouts kvcli reads; by first field: {firsts}; e.g. "
                          f"{r.unknown.examples[0]}; counted, not read as any layout"))
    if r.legacy_keys:
        models = ", ".join(f"{m} ({n:,})" for m, n in r.legacy_models.most_common())
        parts.append(Text(f"older layout: {r.legacy_keys:,} keys in LMCache {LEGACY_VERSIONS}'s layout "
                          f"{LEGACY_KEY_FORMAT}, by model: {models}; counted, not read (kvcli reads LMCache "
                          f"{LMCACHE_VERSION}'s layout; an LMCache that writes the older layout is a 0.3.x release)"))
    s = r.server
    memory = ("every key" if r.memory_sampled is None else "not read" if r.memory_sampled == 0
              else f"sampled {r.memory_sampled:,} keys across the models, scaled")
    return Group(*parts, Text(f"layout: {KEY_FORMAT} (LMCache {LMCACHE_VERSION}, redis:// connector); resp:// "
                             f"the same key without the suffix; multiprocess {{model}}@{{kv_rank}}@{{object_group}}@"
                             f"{{hash}}[@{{salt}}]\n"
                             f"{'cluster totals, ' if r.cluster else ''}server {s.version}: used_memory "
                             f"{fmt_bytes(s.used_memory)}, evicted_keys {s.evicted_keys:,}; MEMORY USAGE: {memory}; "
                             f"{'CLIENT NO-TOUCH' if r.no_touch else 'reads touched keys (no CLIENT NO-TOUCH)'}; "
                             f"{r.seconds:.2f} s"))


def map_view(maps: list[ChunkMap]) -> Group:
    """``kvcli inspect --prompt/--tokens/--request``: per chunk size, one row per full chunk (hash, tokens, status,
    TTL), then the hit / prefill split and where the hit run breaks."""
    parts: list[RenderableType] = []
    for m in maps:
        rows = [[r.index, r.hash[:16], f"{r.start}-{r.end}", r.status, "–" if r.ttl is None else f"{r.ttl:.0f} s"]
                for r in m.rows]
        table = plain_table(f"{m.namespace} / chunk size {m.chunk_size} / {m.model_id}",
                            ["chunk", "hash", "tokens", "status", "ttl"], rows)
        where = "no break" if m.break_index is None else f"breaks at chunk {m.break_index}: {m.break_reason}"
        if not m.rows:  # nothing to look up: a partial chunk is never cached, by kvcli or an engine
            where = (f"no full chunk to look up ({m.prompt_tokens:,} tokens, fewer than the chunk size "
                     f"{m.chunk_size:,}: a partial chunk is never cached)")
        if m.break_index is None and m.rows and m.prompt_tokens == len(m.rows) * m.chunk_size:
            where += " (every chunk hits; the last token is computed again for the logits, as an engine does)"
        parts += [table, Text(f"{m.prompt_tokens:,} tokens: {m.hit_tokens:,} reused, {m.prefill_tokens:,} to "
                              f"prefill; {where}")]
    return Group(*parts)


def purge_scope(namespace: str, chunk_size: int | None) -> str:
    """What ``kvcli purge`` deletes, in words: ``namespace 'fleet'`` (``, chunk size 16``)."""
    return f"namespace {namespace!r}" + (f", chunk size {chunk_size}" if chunk_size else "")


def purge_count_line(found: PurgeCount, scope: str, owner: str = "kvcli") -> str:
    """``kvcli purge``'s count before deleting (on stderr): keys, metadata, payloads, route index keys (when any),
    and per shard on a cluster; ``owner`` names whose layout the keys are in (``"kvcli"``, ``"LMCache"``)."""
    shards = "" if len(found.by_shard) < 2 else (
        f" on {len(found.by_shard)} shards: " + ", ".join(f"{k} {v:,}" for k, v in found.by_shard.items()))
    route = f", {found.route_index:,} route index keys" if found.route_index else ""
    return (f"{found.keys:,} {owner} keys in {scope} ({found.metadata:,} metadata, {found.payloads:,} payloads"
            f"{route}){shards}")


def purge_view(done: PurgeCount, scope: str, owner: str = "kvcli") -> Text:
    """``kvcli purge``'s result: the keys deleted, or that there was nothing to delete (``owner``: as
    :func:`purge_count_line`)."""
    if not done.keys:
        return Text(f"nothing to delete: {scope} holds no {owner} keys")
    return Text(f"deleted {done.deleted:,} keys of {scope}")
