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
