"""The batcher's connection at the end of a replay: every script it sent has run before close() returns, even one
whose reply a Ctrl-C stopped waiting for (a cleanup's purge after it must find every key it wrote)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from kvcli.store.batch import Batcher
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.records import StoreConfig

# another client's script that holds the server a few tenths of a second (a counting loop: TIME is frozen inside a
# script), well under the server's BUSY threshold (5 s): a batch sent meanwhile waits behind it
HOLD = "local n = 0; for i = 1, 30000000 do n = n + 1 end; return n"


@pytest.mark.single_server
def test_close_waits_for_a_script_whose_reply_an_interrupt_abandoned(redis_client, monkeypatch):
    store = ChunkStore(redis_client, StoreConfig("b", 4, "m", "raw", (2, 2, 2, 3), torch.float32,
                                                 payload="accounted"))
    batcher = Batcher(store)
    prompts = [store.chunk(np.arange(1, 9, dtype="<u4"))]
    batcher.answers(batcher.submit(prompts))  # the first batch is answered at once (a refusal would show)
    holder = threading.Thread(target=lambda: redis_client.eval(HOLD, 0))
    holder.start()
    time.sleep(0.1)  # the server is held now
    sent = batcher.submit([store.chunk(np.arange(11, 23, dtype="<u4"))])  # 3 new chunks, waiting to run

    def interrupted(batch):
        raise KeyboardInterrupt  # as if Ctrl-C came right after the batch left the list of those due

    monkeypatch.setattr(batcher, "_replies", interrupted)
    with pytest.raises(KeyboardInterrupt):
        batcher.answers(sent)
    conn, read = batcher._conn, []
    real_read = conn.read_response
    monkeypatch.setattr(conn, "read_response", lambda *a, **k: read.append(real_read(*a, **k)) or read[-1])
    batcher.close()
    # close() read the abandoned batch's reply: the script had run (its 3 chunks written) before close() returned,
    # so a cleanup sent after it cannot be overtaken by it
    assert len(read) == 1 and read[0][2:-2] == [0, 0, 0, 2]  # hit chunks, metadata hits, present, "missing"
    assert redis_client.dbsize() == 2 + 3
    holder.join()


def _own_values(client, prefix: str) -> dict[bytes, bytes]:
    """A namespace's keys (its prefix taken out) and values (their "created" second taken out)."""
    import re

    return {k[len(prefix):]: re.sub(rb'"created":\d+', b"", client.get(k)) for k in client.keys(prefix + "*")}


@pytest.mark.single_server
def test_a_request_writing_more_chunks_than_one_mset_takes_writes_them_all(redis_client):
    """The batch script writes a request's missing chunks in MSETs of at most _SCRIPT_MSET_PAIRS keys: requests with
    more (2,345 new chunks; a run broken at a key of another type, 499 present chunks after it and 1,200 new ones;
    a run broken by a missing chunk, 1,645 new ones after it) get exactly the counts and values of one by one."""
    from kvcli.store import batch

    def config(namespace):
        return StoreConfig(namespace, 2, "m", "raw", (2, 2, 2, 3), torch.float32, payload="accounted")

    tokens = np.arange(1, 2 * 2345 + 1, dtype="<u4")
    longer = np.concatenate([tokens[:3000], np.arange(10**6, 10**6 + 2400, dtype="<u4")])
    broken = tokens.copy()
    broken[2 * 700] += 7  # chunk 700 and the chain after it hash apart: a missing chunk breaks the run
    assert batch._SCRIPT_MSET_PAIRS < 1200
    one, many = ChunkStore(redis_client, config("one")), ChunkStore(redis_client, config("many"))
    batcher = Batcher(many)
    got, expected = [], []
    try:
        for requests in ([tokens], [longer, broken, tokens]):
            for store in (one, many):  # chunk 1000 of the first request: a key of another type, overwritten
                if requests[0] is longer:
                    redis_client.delete(store.meta_key(store.chunk(tokens).hashes[1000]))
                    redis_client.hset(store.meta_key(store.chunk(tokens).hashes[1000]), "a", "b")
            for t in requests:
                prompt = one.chunk(t)
                look = one.lookup(prompt)
                stored = one.store(prompt, None, start_chunk=look.hit_chunks, lookup=look)
                expected.append((look.hit_chunks, look.metadata_hit_chunks, look.break_reason,
                                 stored.chunks_written, stored.metadata_bytes))
            got += [(look.hit_chunks, look.metadata_hit_chunks, look.break_reason, stored.chunks_written,
                     stored.metadata_bytes)
                    for look, stored in batcher.answers(batcher.submit([many.chunk(t) for t in requests]))]
    finally:
        batcher.close()
    assert [g[:4] for g in got] == [(0, 0, "missing", 2345), (1000, 1000, "bad-metadata", 1201),
                                    (700, 700, "missing", 1645), (2345, 2345, "", 0)]
    assert got == expected
    assert _own_values(redis_client, many.prefix) == _own_values(redis_client, one.prefix)
    assert len(_own_values(redis_client, many.prefix)) == 2345 + 1200 + 1645


def test_a_batch_over_its_capacity_deletes_on_the_server_what_the_lru_evicted(redis_client):
    """Chunk size 4, a capacity of 3 chunks, one pipelined batch (lookup_and_store) of three prompts of two chunks:
    A B; C D evicts B (a chain's tail before its head); E F evicts A, then D. The server holds exactly the LRU's
    chunks after the batch, on every shard: an evicted chunk's metadata key is deleted, not only forgotten."""
    from kvcli.store import cluster
    from kvcli.store.batch import lookup_and_store

    store = ChunkStore(redis_client, StoreConfig("cap", 4, "m", "raw", (2, 2, 2, 3), torch.float32,
                                                 payload="accounted", capacity_tokens=12))
    prompts = [store.chunk(np.arange(1, 9, dtype="<u4")), store.chunk(np.arange(100, 108, dtype="<u4")),
               store.chunk(np.arange(200, 208, dtype="<u4"))]
    lookup_and_store(store, prompts)
    assert store.stats.evicted_chunks == 3 and store.resident_chunks == 3
    held = [h for p in prompts for h in p.hashes if redis_client.exists(store.meta_key(h))]
    assert held == prompts[1].hashes[:1] + prompts[2].hashes  # C, then E F: B, A and D evicted in that order
    assert cluster.dbsize(redis_client) == 3
