"""One prompt's chunk map on a live cache: chunk by chunk, where its hit run would break, and why. Read-only.

For a prompt (``token_ids`` ``[tokens]``, or a hash-id prompt's block keys) under one namespace, model and chunk size
(tokens), :func:`chunk_map` hashes the prompt's full chunks (:mod:`kvcli.store.hashing`) and reads each chunk's
metadata, payload and PTTL in one pipelined round trip (plus INFO and DBSIZE when the cause of a missing chunk is
inferred and no ``server`` state was passed): O(chunks) commands, payload bytes included. The result is a
:class:`ChunkMap` with one :class:`MapRow` per full chunk (tokens ``[start, end)``, status, TTL in seconds) and the
hit / prefill split in tokens, by the rule replay and route use (:func:`kvcli.store.hashing.reusable_tokens`: a
prompt whose every chunk hits still computes its last token).

Each chunk is judged by the one judge (:func:`kvcli.store.judge.judge`) as replay's store judges it, its payload's
bytes read (so a checksum failure shows): against the payload layout the store of the model writes
(``expect``, :meth:`kvcli.store.judge.Expected.of_store`), or, where the caller knows no model spec, against the
layout of the prompt's chunk 0 (:meth:`~kvcli.store.judge.Expected.of`): a chunk stored in another layout
(another ``--kv-dtype``) is "other-layout", where replay's lookup stops too.

The read helpers it shares with inspect live in :mod:`kvcli.live.reading`.
"""
from __future__ import annotations

from dataclasses import dataclass

import redis
from redis.cluster import RedisCluster

from kvcli.errors import RedisFailure
from kvcli.live.reading import execute_read, reader
from kvcli.store.hashing import PromptChunker, prompt_length, reusable_tokens
from kvcli.store.judge import HITS, MISSING, WRONG_TYPE, Expected, judge
from kvcli.store.layout import key_prefix, parse_or_none
from kvcli.store.preflight import ServerMemory, server_memory


@dataclass(frozen=True)
class MapRow:
    """One full chunk of a prompt: index, hash hex, tokens ``[start, end)``, status, remaining TTL (s, None: none).

    ``status``: "hit"; for the chunk that breaks the hit run, its state (:mod:`kvcli.store.judge`: "missing",
    "no-payload", "bad-payload", "no-metadata", "checksum", "token-mismatch", "bad-metadata", "other-layout"), or
    "expired" /
    "evicted" for a missing chunk whose cause is inferred; after the break, "unreachable" for a chunk that could
    be used but can never be reached, else its own state.
    """

    index: int
    hash: str
    start: int
    end: int
    status: str
    ttl: float | None


@dataclass(frozen=True)
class ChunkMap:
    """A prompt's chunk-by-chunk map under one namespace, model and chunk size (tokens)."""

    namespace: str
    chunk_size: int
    model_id: str
    prompt_tokens: int
    rows: tuple[MapRow, ...]
    hit_tokens: int
    prefill_tokens: int
    break_index: int | None
    break_reason: str
    warning: str = ""  # set by the caller: e.g. the namespace holds nothing for this model and chunk size

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {**{k: v for k, v in self.__dict__.items() if k != "rows"}, "rows": [r.__dict__ for r in self.rows]}


def chunk_map(client: redis.Redis | RedisCluster, token_ids, namespace: str, chunk_size: int, model_id: str,
              tokenizer: str, cache_salt: str = "", server: ServerMemory | None = None,
              expect: Expected | None = None) -> ChunkMap:
    """Where a prompt's hit run would break, and why (``token_ids``: token ids ``[tokens]``, or a hash-id prompt's block
    keys, :class:`kvcli.store.hashing.BlockPrompt`, hashed from its keys as replay and warm hash it); read-only (two
    pipelined round trips, payloads included), over one connection in ``CLIENT NO-TOUCH`` mode where the server has
    it (:func:`kvcli.live.reading.reader`).

    A key of another type than a string at a chunk's metadata name makes it "bad-metadata"; at its payload name,
    "bad-payload". A chunk with no key at all is "missing"; it is called "expired" or "evicted" when a later chunk of
    the prompt
    is still present (so this one was stored) and the server's counters show only expiries or only evictions (Redis
    keeps no record of a removed key, so this is inferred). ``expect``: the payload layout of the store replay would
    read with (:meth:`kvcli.store.judge.Expected.of_store` of its config: model, dtype, ``--kv-dtype``); None:
    judged against the prompt's chunk 0 (module docstring).

    Raises:
        RedisFailure: the server refused a read.
    """

    with reader(client) as conn:
        return _chunk_map(conn, token_ids, namespace, chunk_size, model_id, tokenizer, cache_salt, server, expect)


def _chunk_map(client: redis.Redis | RedisCluster, token_ids, namespace: str, chunk_size: int, model_id: str,
               tokenizer: str, cache_salt: str, server: ServerMemory | None, expect: Expected | None) -> ChunkMap:

    prompt = PromptChunker(model_id, tokenizer, chunk_size).chunk(token_ids, cache_salt)
    prefix = key_prefix(namespace, chunk_size)
    pipe = client.pipeline(transaction=False)
    for h in prompt.hashes:
        pipe.get(f"{prefix}m:{h.hex()}")
        pipe.get(f"{prefix}p:{h.hex()}")
        pipe.pttl(f"{prefix}m:{h.hex()}")
    replies = execute_read(pipe, raise_on_error=False) if prompt.hashes else []
    for r in replies[2::3]:
        if isinstance(r, Exception):
            raise RedisFailure(f"Redis read failed: {r}")
    if expect is None and replies and isinstance(replies[0], bytes):  # the layout of the store that wrote chunk 0
        first = parse_or_none(replies[0])
        expect = Expected.of(first) if first is not None else None
    states = [_state(prompt, k, replies[3 * k], replies[3 * k + 1], expect) for k in range(len(prompt.hashes))]
    hits = next((k for k, s in enumerate(states) if s not in HITS), len(states))
    reason = "" if hits == len(states) else states[hits]
    if reason == MISSING and any(s != MISSING for s in states[hits:]):
        server = server or server_memory(client)
        if server.known and bool(server.expired_keys) != bool(server.evicted_keys):
            reason = "expired" if server.expired_keys else "evicted"
    rows = []
    for k, (h, state) in enumerate(zip(prompt.hashes, states)):
        status = "hit" if k < hits else reason if k == hits else "unreachable" if state in HITS else state
        pttl = replies[3 * k + 2]
        rows.append(MapRow(k, h.hex(), k * chunk_size, (k + 1) * chunk_size, status,
                           pttl / 1000 if pttl >= 0 else None))
    n = prompt_length(token_ids)
    reused = reusable_tokens(hits * chunk_size, n)
    return ChunkMap(namespace, chunk_size, model_id, n, tuple(rows), reused, n - reused,
                    None if hits == len(states) else hits, reason)


def _state(prompt, k: int, meta, payload, expect: Expected | None) -> str:
    """Chunk ``k`` (:func:`kvcli.store.judge.judge`, its payload's bytes read, against ``expect``'s layout when
    given). A read error (WRONGTYPE: not a string) is a key of another type; any other error is raised."""
    for reply in (meta, payload):
        if isinstance(reply, Exception) and "WRONGTYPE" not in str(reply):
            raise RedisFailure(f"Redis read failed: {reply}")
    meta, payload = (WRONG_TYPE if isinstance(x, Exception) else x for x in (meta, payload))
    return judge(meta, payload, prompt.token_digest(k), expect=expect)


def absent_warnings(client: redis.Redis | RedisCluster, maps: list[ChunkMap], cause: str = "") -> list[ChunkMap]:
    """``maps`` with a warning on each map whose first chunk is missing (nothing at either of its keys), naming
    what its namespace does hold (models, chunk sizes, key counts): a silent miss is often another seed, model or
    chunk size, or a typo. ``cause``: what the caller found wrong with the prompt itself (a double BOS:
    :func:`kvcli.traces.bos.prompt_bos_note`), said in place of a guess (:func:`kvcli.store.namespace.absent_note`).
    A first chunk that is there but damaged gets no such warning: its status says what is wrong. One SCAN of the
    namespace, only when some map needs it. Read-only."""
    import dataclasses

    from kvcli.store.namespace import absent_note, contents

    todo = [m for m in maps if m.rows and m.rows[0].status in (MISSING, "expired", "evicted")]
    if not todo:
        return maps
    found = {}
    out = []
    for m in maps:
        if m in todo:
            if m.namespace not in found:
                found[m.namespace] = contents(client, m.namespace)
            m = dataclasses.replace(m, warning=absent_note(found[m.namespace], m.namespace, m.model_id,
                                                           m.chunk_size, cause))
        out.append(m)
    return out
