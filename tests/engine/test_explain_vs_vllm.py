"""``kvcli explain`` against a real engine: vLLM 0.32.0's ``num_cached_tokens`` for each request of the recorded
runs (tests/engine/fixtures/, one request at a time, block size 32; README there).

What agrees and why:

* ``--gpu-blocks N`` (vLLM's own pool and scheduler, :mod:`kvcli.sim.scheduler`) gives every request's count of
  all four runs, and its pool (:mod:`kvcli.sim.blockpool`) every batch's blocks stored and removed.
* Unbounded, explain's LRU ``reused_tokens`` at ``--chunk-size 32`` is vLLM's count for every request but a prompt
  of whole blocks that the cache holds whole (synthetic s04: 64 tokens, s13: 160): vLLM's hit stops at the last
  full block within ``n - 1`` tokens, so it recomputes the whole last block (``n - 32``); explain's
  ``reusable(h) = min(h, n - 1)`` recomputes one token (``n - 1``).
* Bounded at ``num_gpu_blocks_override = N``, the LRU agrees (the same exception aside) at ``--capacity-tokens
  (N - 2) * 32``, not ``(N - 1) * 32``: block 0 is vLLM's null block, and the previous request's partial last block
  (no hash) is freed to the front of the free queue and taken first by the next request, so one more block holds
  no cached tokens whenever the previous prompt did not end on a block boundary. (N - 2) matched every request of
  both traces; after a prompt that ends on a boundary (synthetic s03, s04, s08, s13) the pool has one block more
  than that, which changed no count here.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.engine.events import BlockRemoved, BlockStored
from kvcli.engine.recording import read_batches
from kvcli.sim.scheduler import EngineConfig, EngineRequest, EngineSim

FIXTURES = Path(__file__).parent / "fixtures"
BLOCK = 32


def fixture(folder: str, name: str) -> Path:
    path = FIXTURES / folder / name
    return path if path.exists() else Path(f"{path}.gz")


def load_trace(folder: str) -> list[dict]:
    path = fixture(folder, "trace.jsonl")
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        return [json.loads(line) for line in f]


def engine_cached(folder: str, run: str) -> dict[str, int]:
    lines = (FIXTURES / folder / f"{run}.requests.jsonl").read_text().splitlines()
    return {r["id"]: r["cached_tokens"] for r in map(json.loads, lines)}


def explain(folder: str, *capacity: str) -> dict[str, dict]:
    """``kvcli explain TRACE --chunk-size 32 [--capacity-tokens N] --json``: its per-request objects by id."""
    result = CliRunner().invoke(app, ["explain", str(fixture(folder, "trace.jsonl")), "--chunk-size", str(BLOCK),
                                      *capacity, "--json"])
    assert result.exit_code == 0, result.output
    return {r["id"]: r for r in json.loads(result.stdout)["traces"][0]["per_request"]}


def vllm_pool(trace: list[dict], blocks: int) -> tuple[dict[str, int], list[tuple[int, int]]]:
    """``trace`` served one request at a time by vLLM's pool of ``blocks`` blocks (:class:`kvcli.sim.scheduler.
    EngineSim`, keyed here by each block's salted token prefix): each request's cached tokens, and the (blocks
    stored, blocks removed) of each request that changed the cache."""
    engine = EngineSim(EngineConfig(blocks, BLOCK))
    cached, changes = {}, []
    for i, r in enumerate(trace):
        ids, salt = r["token_ids"], r.get("cache_salt", "")
        keys = [(salt, tuple(ids[:BLOCK * (k + 1)])) for k in range(len(ids) // BLOCK)]
        before = engine.pool.stored, engine.pool.evicted
        cached[r["id"]] = engine.admit(EngineRequest(i, keys, len(ids))).cached_tokens
        change = (engine.pool.stored - before[0], engine.pool.evicted - before[1])
        if any(change):
            changes.append(change)
    return cached, changes


def whole_prompt_held(row: dict) -> bool:
    """A prompt of whole blocks whose every token the cache held: vLLM recomputes its last block."""
    return row["prompt_tokens"] % BLOCK == 0 and row["reused_tokens"] == row["prompt_tokens"] - 1


@pytest.mark.parametrize("folder, run, blocks, exceptions", [
    ("synthetic", "unbounded", None, {"s04", "s13"}),
    ("chat", "unbounded", None, set()),
    ("synthetic", "bounded-10", 10, {"s04"}),
    ("chat", "bounded-100", 100, set()),
])
def test_explain_predicts_vllms_cached_tokens(folder, run, blocks, exceptions):
    """Synthetic: 12 of 14 requests exact unbounded, 13 of 14 at 10 blocks; chat: 24 of 24 either way."""
    rows = explain(folder, *(["--capacity-tokens", str((blocks - 2) * BLOCK)] if blocks else []))
    vllm = engine_cached(folder, run)
    assert rows.keys() == vllm.keys()
    differ = {rid for rid in rows if rows[rid]["reused_tokens"] != vllm[rid]}
    assert differ == exceptions
    for rid in differ:
        assert whole_prompt_held(rows[rid]) and vllm[rid] == rows[rid]["prompt_tokens"] - BLOCK


@pytest.mark.parametrize("folder, run, blocks", [
    ("synthetic", "unbounded", 2048), ("synthetic", "bounded-10", 10),
    ("chat", "unbounded", 2048), ("chat", "bounded-100", 100),
])
def test_gpu_blocks_predicts_vllms_cached_tokens_for_every_request(folder, run, blocks):
    rows = explain(folder, "--gpu-blocks", str(blocks), "--output-length", "1")
    assert {rid: row["reused_tokens"] for rid, row in rows.items()} == engine_cached(folder, run)


@pytest.mark.parametrize("folder, blocks, differ", [
    ("synthetic", 10, {"s04", "s10", "s11"}),
    ("chat", 100, {"globex-1-t2", "acme-1-t3", "public-1-t2", "public-1-t4"}),
])
def test_capacity_of_n_minus_1_blocks_overestimates(folder, blocks, differ):
    """At (N - 1) * 32 tokens explain's LRU keeps a block vLLM's pool gives to the previous request's partial last
    block: it predicts more reuse for the requests that need that block."""
    rows = explain(folder, "--capacity-tokens", str((blocks - 1) * BLOCK))
    vllm = engine_cached(folder, f"bounded-{blocks}")
    assert {rid for rid in rows if rows[rid]["reused_tokens"] != vllm[rid]} == differ
    assert all(rows[rid]["reused_tokens"] > vllm[rid] for rid in differ - {"s04"})


@pytest.mark.parametrize("folder, run, blocks", [
    ("synthetic", "unbounded", 2048), ("synthetic", "bounded-10", 10),
    ("chat", "unbounded", 2048), ("chat", "bounded-100", 100),
])
def test_the_pool_model_matches_requests_and_events(folder, run, blocks):
    """kvcli's model of the pool gives every request's cached tokens, and each batch's blocks stored and removed."""
    cached, changes = vllm_pool(load_trace(folder), blocks)
    assert cached == engine_cached(folder, run)
    recorded = []
    for b in read_batches(fixture(folder, f"{run}.events.jsonl")):
        events = b.batch.events
        recorded.append((sum(len(e.block_hashes) for e in events if isinstance(e, BlockStored)),
                         sum(len(e.block_hashes) for e in events if isinstance(e, BlockRemoved))))
    assert recorded == changes
