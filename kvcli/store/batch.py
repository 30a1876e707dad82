"""Pipelined index-only lookups and stores: many requests' lookup-then-store in one or two round trips, the same
answers.

An index-only replay (``--payload accounted``) does, per request, a lookup (one round trip) and a store of the
chunks it found missing (one MSET of metadata: payloads are only accounted), one request after another. Each
request's store depends on its own lookup and its lookup on every earlier store, so done one by one they cost two
round trips per request: most of such a replay's time on a big trace. :class:`Batcher` does a batch of
such requests at once, in one of two ways.

**One script** (a single server, no capacity, scripts allowed: an unlimited index-only replay, the path for huge
traces): the batch is one ``EVAL`` of :data:`_INDEX_SCRIPT`, which does each request's lookup and then its store,
in order, inside the server, a whole batch per call (or a few: a script blocks every other client of the server
while it runs, so one holds at most :data:`MAX_SCRIPT_KEYS` chunks, a few ms here; a request is never split). It goes
out on a connection of its own and the replay goes on cutting and hashing the next requests while the server runs
it; the reply is read when the next batch is submitted (replies come back in the order sent), so one batch is in
flight at a time. The
client's LRU of a capacity (which decides what to delete from what each lookup found) and a cluster (a script's keys
must share a slot) take the two round trips below; so does a server or user that refuses the script (the first
batch is answered before the next is sent, so a refusal shows there and nothing else is lost).

**Two round trips** (:func:`lookup_and_store`), with the same results:

1. one read of every distinct metadata key the batch's prompts name (a single server: one MGET; a cluster: the
   GETs of each shard in one write, every shard's sent before any reply is read, :func:`kvcli.store.cluster.
   by_shard`): the server's state before the batch;
2. the requests are answered in order, each from that state overlaid with what the batch's earlier requests wrote
   or deleted (the run's namespace is its own: this process is its only writer and knows those values byte for
   byte), with the code the one-by-one path runs, through the store's :class:`~kvcli.store.batchport.BatchPort`:
   :meth:`~kvcli.store.batchport.BatchPort.evaluate` (judged from the metadata and, for a real chunk, its
   payload's length, read in one more round trip where the batch names one: see :func:`batchable`),
   :meth:`~kvcli.store.batchport.BatchPort.plan_write` (the LRU's deletes and the MSET of the missing chunks) and,
   once the server acknowledged the writes, :meth:`~kvcli.store.batchport.BatchPort.account_write`;
3. every request's deletes and writes in request order, in one round trip (a single server: one pipeline of DELs
   and MSETs, the MSETs of consecutive requests without a DEL between them merged into one; a cluster: one DEL or
   SET per key through :func:`~kvcli.store.cluster.by_shard`, whose per-shard order keeps the order of the
   commands on each key), held from Ctrl-C until acknowledged
   (:func:`~kvcli.store.cluster.uninterrupted`), so a cleanup after an interruption sees all of it or none.

The server ends in the same state, and every request gets the same lookup, as one by one (tests replay traces both
ways, on a single server and on a cluster, with and without a capacity), except where the server itself deletes
keys during a batch (maxmemory evictions): one by one sees such a loss at the next lookup, a batch at the next
batch. What batching loses is each lookup's own latency: one request in :data:`SAMPLE_EVERY` (the first with a full
chunk from every :data:`SAMPLE_EVERY`-th on) also gets one unpipelined, timed lookup (read-only, its answer not
used; taken while no batch is in flight), the store's ``lookup_seconds`` holds those samples (``lookups_sampled``),
and each pipelined lookup is priced at their mean so far (its ``seconds``); a caller that prices its lookups
otherwise (a priced replay) takes none.

Faults (a tolerant store, :mod:`kvcli.store.calls`): a read that fails after retries makes every lookup of
the batch a failed one (a miss that stores nothing); a write that fails stores nothing for the batch's requests
(their lookups stand), each counted once in the store's stats. A batch script is never sent twice (a second run
would find its own writes and call them hits): a dropped connection or a timeout fails its lookups, and those of a
batch sent after it on that connection, whether or not the server ran them (then the server holds chunks the
report does not count as stored: later lookups may hit them).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from kvcli.errors import RedisFailure
from kvcli.store.batchport import BatchPort
from kvcli.store.calls import RedisUnavailable, ScriptKilled, ServerBusy, execute_pipeline
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.cluster import by_shard, uninterrupted
from kvcli.store.hashing import ChunkedPrompt
from kvcli.store.judge import JUDGE_LUA, NOT_READ, STATES
from kvcli.store.layout import is_real
from kvcli.store.records import NOTHING_STORED, LookupResult, StoreResult
from kvcli.store.resp import HASH_BYTES, bulk, command, hash_keys
from kvcli.store.server import script_refused
from kvcli.store.written import METADATA

MAX_SCRIPT_KEYS = 512  # chunks per batch script at most: a script blocks every other client while it runs (256
# requests at chunk size 16 were 200k keys, 1-2 s, past redis-py's reply timeout at times), and small scripts cost the
# server less per chunk: 0.95 / 0.85 / 0.82 / 0.82 s of server CPU for the 12,031-request trace at chunk 512 with
# scripts of at most 4,096 / 1,024 / 512 / 256 keys (the same batches replayed; 0.93 s one request a script)
SAMPLE_EVERY = 64  # 1 in 64 requests also gets an unpipelined, timed lookup: ~120 latency samples per 7,500
_MSET_ARGS = 1 << 18  # arguments of one merged MSET at most, far below a server's multibulk limit (1M before 7)


def batchable(store) -> bool:
    """Whether ``store``'s lookup-then-store can go through :func:`lookup_and_store` with the same answers: kvcli's
    layout, no read-only namespace (another writer's chunks) and no TTL (the one-by-one path it mirrors writes with
    MSET). Its estimated requests store accounted chunks; a real chunk (a measured request's, written one at a time
    between batches) is judged with its payload's length as the lookup judges it, read in the batch script, or in
    one more round trip where the batch names one."""
    if not isinstance(store, ChunkStore):
        return False
    cfg = store.batch_port().config
    return cfg.read_namespace is None and cfg.ttl is None


def lookup_and_store(store: ChunkStore, prompts: list[ChunkedPrompt], sample_every: int = SAMPLE_EVERY,
                     quiet=None) -> list[tuple[LookupResult, StoreResult]]:
    """Lookup, then store the missing chunks as accounted (index only), for each prompt in order, in two round trips:
    the same results as ``look = store.lookup(p)`` then ``store.store(p, None, start_chunk=look.hit_chunks,
    lookup=look)`` for each prompt in turn (module docstring).

    Args:
        store: a store for which :func:`batchable` holds.
        prompts: prompts cut and hashed by ``store`` (:meth:`ChunkStore.chunk`), in request order.
        sample_every: time one unpipelined lookup per N requests (the first one with a full chunk from each N-th
            on, counted over the store's life); 0: none (a caller that prices lookups instead).
        quiet: a context manager factory each timed lookup runs inside (:meth:`Batcher.__init__`), or None.

    Returns:
        ``[(lookup, store result)]`` per prompt, acknowledged by the server. A lookup's ``seconds`` is the mean of
        the sampled unpipelined lookups so far; a store result's ``seconds`` its share of the wall time spent
        planning and sending the batch's writes.

    Raises:
        RedisFailure: the server refused a read or a write (e.g. OOM, permissions).
        RedisUnavailable: a call failed after retries and the store does not absorb it (module docstring).
    """
    return _lookup_and_store(store.batch_port(), prompts, sample_every, quiet)


def _lookup_and_store(port: BatchPort, prompts: list[ChunkedPrompt], sample_every: int,
                      quiet) -> list[tuple[LookupResult, StoreResult]]:
    """:func:`lookup_and_store` through the store's port."""
    if not prompts:
        return []
    st, calls = port.stats, port.calls
    _sample(port, prompts, sample_every, quiet)
    st.count_pipelined_lookups(len(prompts))
    price = st.mean_lookup_seconds()
    meta = port.meta_head
    keys = list(dict.fromkeys(meta + x for p in prompts for x in p.hexes))  # distinct: prompts share prefixes
    try:
        values = calls.read(keys) if keys else []
    except RedisUnavailable as exc:
        calls.absorb(exc)
        return [(LookupResult.failure(len(p.hashes), price), NOTHING_STORED) for p in prompts]
    st.count_lookup_round_trips(bool(keys))
    state = dict(zip(keys, values))  # the server's before the batch, then overlaid with the batch's own writes
    try:
        lengths = _real_lengths(port, keys, values)
    except RedisUnavailable as exc:
        calls.absorb(exc)
        return [(LookupResult.failure(len(p.hashes), price), NOTHING_STORED) for p in prompts]
    t0 = time.perf_counter()
    pipe: Any = None if port.cluster else port.client.pipeline(transaction=False)  # a single server's
    commands: list[tuple] = []  # a cluster: every DEL and SET in request order
    mset: list = []  # a single server: the MSET arguments since the last DEL (one MSET for consecutive requests)
    looks, plans = [], []
    for prompt in prompts:
        metas = [state[meta + x] for x in prompt.hexes]
        look = port.evaluate(prompt, metas, None if not lengths else port.judged(
            prompt, metas, [lengths.get(meta + x, NOT_READ) for x in prompt.hexes]), price)
        plan = port.plan_write(prompt, None, look.hit_chunks, len(prompt.hashes), look)
        deleted = plan.deletes  # the LRU's victims, deleted before this request's writes
        for key in deleted:
            state[key] = None
        if port.cluster:
            commands += [("DEL", key) for key in deleted]
            commands += [("SET", key, value) for key, value in plan.thens]
            state.update(plan.thens)
        else:
            if deleted or len(mset) > _MSET_ARGS:
                if mset:
                    pipe.execute_command("MSET", *mset)
                    mset = []
                if deleted:
                    pipe.delete(*deleted)
            mset += plan.args
            state.update(zip(plan.args[::2], plan.args[1::2]))
        looks.append(look)
        plans.append(plan)
    if mset:
        pipe.execute_command("MSET", *mset)
    try:
        with uninterrupted():  # sent whole and acknowledged, or not at all
            if port.cluster and commands:
                calls.call(_write, port.client, commands, port.shard_trips)
            elif not port.cluster and len(pipe):
                port.shard_trips.add()
                calls.call(execute_pipeline, pipe, name="EXECUTE")
    except RedisUnavailable as exc:
        calls.absorb(exc)
        return [(look, NOTHING_STORED) for look in looks]
    seconds = (time.perf_counter() - t0) / len(prompts)
    return [(look, port.account_write(plan, seconds)) for look, plan in zip(looks, plans)]


def _real_lengths(port: BatchPort, keys: list[str], values: list) -> dict[str, int]:
    """The payload STRLEN of every chunk whose metadata (``values`` of metadata ``keys``) records a real payload,
    by metadata key: one more round trip, only where the batch names such a chunk (a real-payload replay's chunks
    are mostly accounted). A chunk the batch itself writes is accounted, so these lengths stay the server's.

    Raises:
        RedisUnavailable: the read failed after retries.
    """
    real = [k for k, v in zip(keys, values) if isinstance(v, bytes) and is_real(v)]
    if not real:
        return {}
    own, cut = port.payload_head, len(port.meta_head)
    replies = port.calls.strlens([own + k[cut:] for k in real])
    return dict(zip(real, replies))


def _sample(port: BatchPort, prompts: list[ChunkedPrompt], sample_every: int, quiet=None) -> None:
    """The latency samples of a batch: one unpipelined, timed lookup (read-only, its answer not used) for the first
    request with a full chunk from every ``sample_every``-th lookup on (counted over the store's life; none when
    ``sample_every`` is 0), each inside ``quiet()`` when given (a context manager that stops other work of this
    replay for the timing)."""
    st = port.stats
    if sample_every <= 0:
        return
    for i, prompt in enumerate(prompts):
        if prompt.chunks and st.lookups_sampled * sample_every <= st.lookups_pipelined + i:  # lookups with a chunk
            with quiet() if quiet is not None else contextlib.nullcontext():
                t0 = time.perf_counter()
                try:
                    port.read_chunks(prompt, record=False)
                except RedisUnavailable as exc:
                    port.calls.absorb(exc)
                    continue
                seconds = time.perf_counter() - t0
            st.count_sample(seconds)


def _write(client, commands: list[tuple], trips) -> list:
    """:func:`~kvcli.store.cluster.by_shard`, raising the first error reply."""
    replies = by_shard(client, commands, trips)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


# -- the scripted batch: lookups and stores inside the server, one batch in flight --------------------------------
# KEYS: the metadata key of every full chunk of every request of the batch, request after request (a key repeats
# where requests share a prefix). ARGV[1]: their 8-byte token digests, concatenated in the same order; ARGV[2] and
# ARGV[3]: an accounted metadata value's constant parts (kvcli.store.layout.MetadataWriter: middle, tail); ARGV[4]:
# the exact length of a real payload value; ARGV[5..]: each request's number of full chunks. Per request, in order:
# every chunk's state by the chunk judge's Lua twin (kvcli.store.judge.JUDGE_LUA), then one MSET (in slices of
# _SCRIPT_MSET_PAIRS keys: Lua's unpack has a stack limit) of what BatchPort.plan_write writes: the chunks from the
# hit run's end on that are not hits, with the same values; SET per key would give the same server state, MSET is
# one command instead of one per chunk.
# What a chunk's state is read from, the least the judge's answer needs:
# * a GET of the metadata (no key: missing; a key of another type: GET's error, bad metadata); the judge is asked
#   first as if no payload length were read, and only where that answer is "bad-payload" for a length not read
#   (-1: metadata with the digest that records a real payload) is the payload's STRLEN read and the judge asked
#   again (its key the metadata key's with ``p:`` for ``m:``: the script runs on a single server only, where a key
#   it derives is as good as one it is given); the judge's other answers do not depend on the length;
# * once the chunk that breaks the hit run is missing, the later ones are not read but judged missing (where this
#   script runs: the run's own namespace, no capacity, no TTL, no server evictions, nothing is ever deleted and a
#   request stores every chunk from its hit run's end on, so a chunk is there only with every chunk before it):
#   missing is not a hit nor a metadata hit, so the request's counts are settled there, and each later chunk is
#   written.
# Returns the script's start and end (TIME: seconds, microseconds) and 4 integers per request: hit chunks, metadata
# hit chunks, hit chunks after the hit run, the state code of the chunk that broke the run (-1: it did not). A key
# of another type is bad metadata and is overwritten, as an MSET would.
_SCRIPT_MSET_PAIRS = 1000  # keys per MSET inside the batch script: 2,000 values unpacked, under Lua's 8,000
_INDEX_SCRIPT = JUDGE_LUA + """
local digests, head, tail = ARGV[1], string.rep('\\0', 8) .. ARGV[2], ARGV[3]
local value_bytes, mset_args = tonumber(ARGV[4]), 2 * """ + str(_SCRIPT_MSET_PAIRS) + """
local t = redis.call('TIME')
local out, base = {t[1], t[2]}, 0
for r = 5, #ARGV do
  local n = tonumber(ARGV[r])
  local ok, hit, meta_hit, reason = {}, n, n, -1
  for i = 1, n do
    local key = KEYS[base + i]
    local m = redis.pcall('GET', key)
    if not m then  -- missing (judge's code 2)
      if hit == n then hit, reason = i - 1, 2 end
      if meta_hit == n then meta_hit = i - 1 end
      if reason == 2 then break end  -- every later chunk: judged missing, not read
    else
      local digest = string.sub(digests, 8 * (base + i) - 7, 8 * (base + i))
      local s = judge(m, -1, digest, value_bytes)
      if s == 5 then  -- real metadata with this digest: its payload's length decides
        local len = redis.pcall('STRLEN', string.sub(key, 1, -35) .. 'p:' .. string.sub(key, -32))
        if type(len) ~= 'number' then len = -2 end
        s = judge(m, len, digest, value_bytes)
      end
      ok[i] = s <= 1
      if not ok[i] and hit == n then hit, reason = i - 1, s end
      if s ~= 0 and s ~= 1 and s ~= 4 and s ~= 5 and s ~= 8 and meta_hit == n then meta_hit = i - 1 end
    end
  end
  local present, args = 0, {}
  for i = hit + 1, n do
    if ok[i] then present = present + 1 else
      local parent = ''
      if i > 1 then parent = string.sub(KEYS[base + i - 1], -32) end
      args[#args + 1] = KEYS[base + i]
      args[#args + 1] = string.sub(digests, 8 * (base + i) - 7, 8 * (base + i)) .. head .. parent .. tail
      if #args == mset_args then redis.call('MSET', unpack(args)); args = {} end
    end
  end
  if #args > 0 then redis.call('MSET', unpack(args)) end
  out[#out + 1] = hit; out[#out + 1] = meta_hit; out[#out + 1] = present; out[#out + 1] = reason
  base = base + n
end
t = redis.call('TIME')
out[#out + 1] = t[1]; out[#out + 1] = t[2]
return out
"""
_EVAL, _INDEX_SCRIPT_BULK = bulk(b"EVAL"), bulk(_INDEX_SCRIPT)  # the batch command's first two arguments, packed


@dataclass
class Batch:
    """One batch handed to :meth:`Batcher.submit`: its prompts, and its answers once known (a scripted batch in
    flight: None until :meth:`Batcher.answers`)."""

    prompts: list[ChunkedPrompt]
    answers: list[tuple[LookupResult, StoreResult]] | None = None
    price: float = 0.0  # seconds: the mean sampled lookup when it was sent
    sent_seconds: float = 0.0  # client-side seconds to build and send it
    value_bytes: int = 0  # bytes of one metadata value it writes with a parent
    scripts: list[int] = field(default_factory=list)  # requests per script it was sent as, in order
    packed: list[list] = field(default_factory=list)  # each script's command, packed (sent again after BUSY)


class Batcher:
    """A store's pipelined lookups and stores (:func:`batchable`), a batch at a time, with the same answers as one
    request at a time (module docstring).

    On a single server without a capacity, where the server runs scripts, a batch is ONE ``EVAL`` of
    :data:`_INDEX_SCRIPT` (the requests' lookups and stores in order, inside the server) on a connection of its
    own, and :meth:`submit` returns once it is sent: the server runs it while the caller cuts and hashes the next
    requests, and :meth:`answers` reads its reply (replies come in the order sent, on the one connection). Else
    (a cluster, a capacity whose LRU the client keeps, scripts refused) :func:`lookup_and_store` answers the batch
    in :meth:`submit` (two round trips). A scripted batch's store seconds are its client-side build and send plus
    the script's own time on the server (``TIME`` at its start and end; it includes the batch's lookups' work
    there), shared equally among its requests.

    A scripted batch is not retried: a dropped connection or a timeout fails its lookups (misses that store
    nothing, as a failed write does in :func:`lookup_and_store`) whether or not the server ran it, and is counted
    in the store's stats; :meth:`close` reads any reply still due, so that nothing this process sent runs after it
    (a cleanup after an interruption then sees every write).
    """

    def __init__(self, store: ChunkStore, sample_every: int = SAMPLE_EVERY, quiet=None) -> None:
        """``store``: one for which :func:`batchable` holds, driven through its port alone
        (:meth:`~kvcli.store.chunkstore.ChunkStore.batch_port`). ``sample_every``: as :func:`lookup_and_store`'s
        (0: no latency samples). ``quiet``: a context manager factory each latency
        sample runs inside (e.g. one that stops the process hashing the trace ahead,
        :meth:`kvcli.replay.prefetch.Prefetch.paused`), or None."""
        self.port, self.sample_every, self.quiet = store.batch_port(), sample_every, quiet
        self.scripted = self.port.scripted
        self._conn: Any = None  # a connection of its own (redis-py's Connection), made at the first batch
        self._due: list[Batch] = []  # sent, reply not read yet: in the order sent
        self._unread = 0  # script replies not read yet on the connection (:meth:`_eval`)
        self._tried = False  # a first scripted batch was answered (a refusal would have shown there)

    def submit(self, prompts: list[ChunkedPrompt]) -> Batch:
        """Read the replies of the batches in flight (their :class:`Batch` objects get their answers), take this
        batch's latency samples on the idle server, then send it (scripted) or answer it (:func:`lookup_and_store`).

        Raises:
            RedisFailure, RedisUnavailable: as :func:`lookup_and_store`.
        """
        while self._due:
            self._receive(self._due.pop(0))
        if not self.scripted or not any(p.chunks for p in prompts):
            return Batch(prompts, _lookup_and_store(self.port, prompts, self.sample_every, self.quiet))
        port = self.port
        _sample(port, prompts, self.sample_every, self.quiet)
        t0 = time.perf_counter()
        meta = port.meta_head
        now = int(time.time())
        middle, tail = port.metadata.middle, port.metadata.tail(False, now)
        st = port.stats
        batch = Batch(prompts, None, st.mean_lookup_seconds(), 0.0, port.metadata.length(False, False, now))
        if self._conn is None:  # a connection of its own (only a scripted batch sends on it: a single server)
            self._conn = port.new_connection()
        fixed = bulk(middle) + bulk(tail) + bulk(port.config.value_bytes)
        for group in _groups(prompts):  # scripts of at most MAX_SCRIPT_KEYS keys (a request is never split)
            hashes = b"".join(p.hash_bytes for p in group)
            keys = len(hashes) // HASH_BYTES
            batch.packed.append([command(
                7 + keys + len(group), _EVAL, _INDEX_SCRIPT_BULK, bulk(keys), hash_keys(meta, hashes),
                bulk(b"".join(p.digest_bytes for p in group)), fixed, *[bulk(p.chunks) for p in group])])
            batch.scripts.append(len(group))
        self._due.append(batch)  # before it is sent: however this ends, close() or a reply records its writes
        try:
            with uninterrupted():  # sent whole or not at all
                port.calls.call(self._eval, [c for packed in batch.packed for c in packed], len(batch.packed),
                                record=False, name="EVAL")
        except RedisUnavailable as exc:
            st.count_faults(timeouts=exc.timeout)
            self._due.remove(batch)
            self._drop()
            self._fail(batch)
            port.calls.absorb(exc)
            return batch
        batch.sent_seconds = time.perf_counter() - t0
        if not self._tried:  # the first: answered now, so that a refusal falls back before anything else is sent
            try:
                self._receive(self._due.pop(0))
            except _Refused:
                self.scripted = False
                self._drop()
                st.count_round_trips(-1)  # the refused one
                return Batch(prompts, _lookup_and_store(port, prompts, self.sample_every, self.quiet))
        return batch

    def answers(self, batch: Batch) -> list[tuple[LookupResult, StoreResult]]:
        """``[(lookup, store result)]`` per prompt of ``batch``, as :func:`lookup_and_store` returns them (reading
        the replies of the batches sent before it first, and its own).

        Raises:
            RedisFailure: the server refused the script (e.g. OOM, permissions) after the first batch.
            RedisUnavailable: the reply failed and the store does not absorb it.
        """
        while batch.answers is None:
            self._receive(self._due.pop(0))
        return batch.answers

    def close(self) -> None:
        """Read every reply still due (answers dropped), then close this batcher's connection. Call it however the
        replay ends: before a cleanup, nothing this process sent may still be waiting to run."""
        for due in self._due:
            due.answers = []
            self._record(due)
        try:
            while self._unread > 0 and self._conn is not None:  # every script sent, even one whose reply a
                self._eval()  # Ctrl-C stopped waiting for: it may not have run yet
        except Exception:  # a broken connection: whatever the server had, it ran or dropped
            pass
        finally:
            self._due = []
            self._drop()

    def _receive(self, batch: Batch) -> None:
        """Read ``batch``'s replies and answer it, recording in the store's ``written`` the chunks it wrote, or
        every chunk it names when its replies are not all read (however that ends)."""
        try:
            self._answer(batch)
        except BaseException:
            self._record(batch)
            raise

    def _record(self, batch: Batch, hits: list[int] | None = None) -> None:
        """Record in the store's ``written`` the chunks ``batch``'s scripts may have written: each request's chunks
        from ``hits`` (its hit chunks, where its reply was read) on, else every chunk it names."""
        hits = hits or [0] * len(batch.prompts)
        self.port.written.add(METADATA, (p.hash_bytes[HASH_BYTES * hit:] for p, hit in zip(batch.prompts, hits)))

    def _answer(self, batch: Batch) -> None:
        port, st = self.port, self.port.stats
        try:
            replies = self._replies(batch)
        except (ScriptKilled, _Lost) as exc:  # every reply was read: the connection stays
            self._fail(batch)
            port.calls.absorb(exc)
            return
        except RedisUnavailable as exc:
            st.count_faults(timeouts=exc.timeout)  # on this connection of its own, not redis-py's retry's to count
            self._drop()
            for due in [batch, *self._due]:  # lost with the connection, whether or not the server ran them
                self._fail(due)
            self._due = []
            port.calls.absorb(exc)
            return
        except RedisFailure as exc:
            if not self._tried and script_refused(exc):
                raise _Refused() from None
            raise
        finally:
            self._tried = True
        n = len(batch.prompts)
        st.count_pipelined_lookups(n)
        st.count_lookup_round_trips(1)
        port.shard_trips.add()
        server = sum((int(r[-2]) - int(r[0])) + (int(r[-1]) - int(r[1])) / 1e6 for r in replies)
        seconds = (batch.sent_seconds + server) / n  # not the wait for the reply: the server's time is in it
        cs = port.config.chunk_size
        answers = []
        counts = [int(x) for r in replies for x in r[2:-2]]
        self._record(batch, counts[0::4])  # a request writes only from its hit run's end on
        for i, prompt in enumerate(batch.prompts):
            hit, meta_hit, present, reason = counts[4 * i:4 * i + 4]
            full = prompt.chunks
            written = full - hit - present
            look = LookupResult(hit, hit * cs, full, "" if reason < 0 else STATES[reason], batch.price,
                                metadata_hit_chunks=meta_hit)
            meta_bytes = written * batch.value_bytes - (32 if written and hit == 0 else 0)  # chunk 0: no parent
            answers.append((look, port.account_written(written, meta_bytes, seconds, present)))
        batch.answers = answers

    def _replies(self, batch: Batch) -> list:
        """The reply of every script of ``batch``, read in order (an error reply too: none is left on the
        connection). Scripts answered BUSY (another client's script ran; they did not) are sent again, in order,
        with :meth:`~kvcli.store.calls.Calls.call`'s waits, while nothing sent after them has run.

        Raises:
            ScriptKilled: another client's SCRIPT KILL stopped one of them.
            _Lost: a script ran after one answered BUSY, or another batch was sent behind it: sending that one
                again would run it out of order.
            RedisUnavailable: a reply did not come (connection, timeout), or BUSY outlasted the reply timeout.
            RedisFailure: the server refused a script (e.g. OOM, permissions).
        """
        calls, st = self.port.calls, self.port.stats
        replies: list = [None] * len(batch.scripts)
        start, backoff = 0, None
        while True:
            busy: list[int] = []
            failed: RedisFailure | None = None
            for i in range(start, len(batch.scripts)):
                try:
                    replies[i] = calls.call(self._eval, record=i == start, name="EVAL", busy_retry=False)
                except ServerBusy:
                    busy.append(i)
                except ScriptKilled as exc:
                    failed = failed or exc
                except RedisUnavailable:
                    raise
                except RedisFailure as exc:
                    failed = failed or exc
            if failed is not None:
                raise failed
            if not busy:
                return replies
            if busy != list(range(busy[0], len(batch.scripts))) or self._due:
                st.count_faults(errors=1)
                raise _Lost("Redis EVAL failed: a batch script answered BUSY ran out of order with the others")
            backoff = backoff or calls.busy_backoff()
            if not backoff.wait():
                raise calls.unavailable("EVAL", f"busy with another client's script for {calls.busy_seconds:g} s, "
                                                f"the reply timeout", True, "BUSY")
            st.count_faults(busy_retries=len(busy))
            start = busy[0]
            with uninterrupted():
                calls.call(self._eval, [c for packed in batch.packed[start:] for c in packed],
                           len(batch.packed) - start, record=False, name="EVAL")

    def _eval(self, packed: list | None = None, scripts: int = 0):
        """Send the packed commands of ``scripts`` scripts, or (None) read one script's reply. :attr:`_unread`
        counts the replies not read yet on the connection, held from Ctrl-C with the read or the send that changes
        it, so :meth:`close` knows exactly how many scripts may still be waiting to run."""
        if packed is None:
            with uninterrupted():
                try:
                    return self._conn.read_response()
                finally:  # an error reply (BUSY, a refusal) is a reply read; a broken connection is dropped
                    self._unread -= 1
        self._conn.send_packed_command(packed)
        self._unread += scripts
        return None

    def _fail(self, batch: Batch) -> None:
        """A batch lost to a connection failure: its lookups failed (misses that store nothing), counted."""
        self.port.stats.count_pipelined_lookups(len(batch.prompts))
        batch.answers = self._failed(batch)
        self._record(batch)  # the server may have run it

    @staticmethod
    def _failed(batch: Batch) -> list[tuple[LookupResult, StoreResult]]:
        return [(LookupResult.failure(p.chunks, batch.price), NOTHING_STORED) for p in batch.prompts]

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.disconnect()
            self._conn = None
        self._unread = 0  # whatever was sent on it ran or was dropped with it


def _groups(prompts: list[ChunkedPrompt]) -> list[list[ChunkedPrompt]]:
    """``prompts`` cut, in order, into runs of at most :data:`MAX_SCRIPT_KEYS` chunks (a longer prompt alone)."""
    groups: list[list[ChunkedPrompt]] = [[]]
    keys = 0
    for prompt in prompts:
        if groups[-1] and keys + prompt.chunks > MAX_SCRIPT_KEYS:
            groups.append([])
            keys = 0
        groups[-1].append(prompt)
        keys += prompt.chunks
    return groups


class _Lost(RedisUnavailable):
    """A batch whose scripts cannot all be answered in order (:meth:`Batcher._replies`): its lookups fail."""


class _Refused(Exception):
    """The server or the user cannot run the batch script (:func:`~kvcli.store.server.script_refused`)."""
