"""vLLM's scheduler over its block pool (kvcli.sim.scheduler): what each request finds cached when it is admitted,
counted by hand on pools of a few 4-token blocks (the last-block rule, the null block, the running request's
partial block, pinned blocks, a hit in the step that computes it, a chunk cut short, preemption), and two
properties: one request at a time is the plain allocate-and-free sequence, and an unlimited pool loses nothing
to requests in flight."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.sim.blockpool import BlockPool
from kvcli.sim.scheduler import EngineConfig, EngineRequest, EngineSim

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"

BS = 4


def req(index: int, chain: str, prompt: int, output: int = 1, arrival: float = 0.0) -> EngineRequest:
    """A request whose prompt is the first ``prompt`` tokens of token chain ``chain`` (keys ``chain0``,
    ``chain1``, ... per full block)."""
    return EngineRequest(index, [f"{chain}{k}" for k in range(prompt // BS)], prompt, output, arrival)


def sim(blocks: int, **settings) -> EngineSim:
    return EngineSim(EngineConfig(blocks, BS, **settings))


def test_a_fully_cached_prompt_of_whole_blocks_computes_its_last_block_again():
    engine = sim(4)  # 3 KV blocks
    assert engine.admit(req(0, "a", 8)).cached_tokens == 0
    # vLLM looks up at most (8 - 1) // 4 = 1 block: 4 tokens, not the 7 of "all but the last token"
    assert engine.admit(req(1, "a", 8)).cached_tokens == 4
    assert engine.admit(req(2, "a", 9)).cached_tokens == 8  # one more token: both blocks


def test_the_null_block_takes_one_of_the_gpu_blocks():
    refused = "10 prompt and 1 output tokens need 3 blocks of 4, but 3 GPU blocks hold 2 .block 0 is the null block"
    with pytest.raises(BadInputError, match=refused):
        sim(3).admit(req(0, "a", 10))
    assert sim(4).admit(req(0, "a", 10)).cached_tokens == 0
    with pytest.raises(BadInputError, match="null block"):
        EngineConfig(1, BS)


def test_a_pool_past_any_engines_is_refused_before_it_is_built():
    # the pool keeps every block (~130 bytes each): 2**24 blocks is the most simulated, one more is refused by the
    # config, before a block is made (1e11 blocks would have exhausted memory)
    assert EngineConfig(1 << 24, BS).num_gpu_blocks == 16_777_216
    for n in (16_777_217, 10**11):
        with pytest.raises(BadInputError, match=f"--gpu-blocks must be <= 16,777,216 .*got {n:,}; a pool that"):
            EngineConfig(n, BS)
    out = CliRunner().invoke(app, ["explain", str(SAMPLES / "tokens_small.jsonl"), "--chunk-size", "32",
                                   "--gpu-blocks", "100000000000"])
    assert out.exit_code == 2 and "--gpu-blocks must be <= 16,777,216" in out.output and "Traceback" not in out.output


def test_the_running_requests_partial_block_takes_a_block_an_lru_of_the_kv_blocks_would_keep():
    # 3 KV blocks (N = 4). a0 a1 is cached; b's 6 tokens need b0 and a partial block: with a's blocks in the free
    # queue as [a1, a0] behind the never-used block 3, b takes block 3 and a1 (the chain's tail). An LRU of 3
    # chunks would hold a0, a1 and b0 and give the third request 8 tokens.
    engine = sim(4)
    engine.admit(req(0, "a", 8))
    engine.admit(req(1, "b", 6))
    assert engine.admit(req(2, "a", 9)).cached_tokens == 4
    roomier = sim(5)
    roomier.admit(req(0, "a", 8))
    roomier.admit(req(1, "b", 6))
    assert roomier.admit(req(2, "a", 9)).cached_tokens == 8


def test_output_tokens_take_blocks_while_the_request_runs():
    # 3 KV blocks; c0 is cached in block 1, behind the never-used blocks 2 and 3. a's 8 prompt tokens and 5 output
    # tokens need ceil(12 / 4) = 3 blocks: its prompt takes 2 and 3, its first output tokens' block evicts c0
    engine = sim(4)
    engine.admit(req(0, "c", 4))
    engine.admit(req(1, "a", 8, output=5))
    assert engine.admit(req(2, "c", 5)).cached_tokens == 0
    short = sim(4)
    short.admit(req(0, "c", 4))
    short.admit(req(1, "a", 8, output=1))
    assert short.admit(req(2, "c", 5)).cached_tokens == 4


def test_a_running_requests_blocks_are_pinned_and_hit():
    # 4 KV blocks, two at a time: a (output 3) and b run together; b finishes first and frees [b1, b0]; a's decode
    # needs a block and takes b1; c shares a0 with a, which a still holds: a hit, and c takes b0 for the rest
    engine = sim(5, max_num_seqs=2, at_once=True)
    first = engine.admit(req(0, "a", 8, output=3))
    assert (first.cached_tokens, first.step, first.time) == (0, 0, 0.0)
    assert engine.admit(req(1, "b", 8)).step == 0
    third = engine.admit(EngineRequest(2, ["a0", "c1"], 8))
    assert (third.cached_tokens, third.pinned_tokens, third.step) == (4, 4, 1)
    assert engine.pool.cached_run(["b0"]) == []


def test_a_prefix_scheduled_in_the_same_step_is_a_hit():
    engine = sim(10, max_num_seqs=4, at_once=True)
    first, second = engine.admit(req(0, "a", 8)), engine.admit(req(1, "a", 12))
    assert (first.step, second.step, second.cached_tokens) == (0, 0, 8)


def test_no_request_is_admitted_while_an_earlier_one_has_prompt_left():
    # a budget of 8 tokens a step: a's 16 tokens take steps 0 and 1 whole; b, sharing them, waits for step 2
    engine = sim(20, max_num_seqs=4, max_num_batched_tokens=8, at_once=True)
    engine.admit(req(0, "a", 16, output=2))
    second = engine.admit(req(1, "a", 20))
    assert (second.step, second.cached_tokens) == (2, 16)


def test_a_preempted_request_keeps_the_cached_tokens_of_its_first_admission():
    # 3 KV blocks, two at a time. Step 0 admits a (block 1 = a0) and b (block 2 = b0). Step 1: a's decode takes
    # block 3; b's needs one more: none free, so b preempts itself (b0 back to the queue) and nobody is admitted.
    # b then waits (its 5 tokens need 2 blocks, its hit b0 one of the free ones) until a's last decode block
    # evicts b0 at step 5 and a finishes (output blocks back: the partial one to the head). Step 6 readmits b with
    # no hit (its tokens and output again), and c waits for room: step 7 admits it with a0, still cached.
    engine = sim(4, max_num_seqs=2, at_once=True)
    assert engine.admit(req(0, "a", 4, output=6)).cached_tokens == 0
    second = engine.admit(req(1, "b", 4, output=2))
    assert (second.cached_tokens, second.step) == (0, 0)
    third = engine.admit(EngineRequest(2, ["a0", "x1"], 8))
    assert (third.cached_tokens, third.step, engine.preemptions) == (4, 7, 1)


def test_requests_arrive_at_their_time_and_an_idle_engine_waits_for_them():
    engine = sim(20, max_num_seqs=4, step_seconds=1.0, prefill_tokens_per_second=4.0)
    first = engine.admit(req(0, "a", 8, arrival=10.0))
    assert (first.step, first.time) == (0, 10.0)
    second = engine.admit(req(1, "a", 12, arrival=11.0))  # step 0 ends at 10 + 1 + 8 / 4 = 13
    assert (second.step, second.time, second.cached_tokens) == (1, 13.0, 8)


def _one_at_a_time(requests: list[EngineRequest], blocks: int) -> list[int]:
    """The plain sequence for one request at a time: look up at most (P - 1) // B blocks, take them and
    ceil((P + L - 1) / B) blocks in all, cache the full ones, free them."""
    pool, out = BlockPool(blocks), []
    for r in requests:
        hits = pool.cached_run(list(r.keys)[:(r.prompt_tokens - 1) // BS])
        pool.touch(hits)
        held = hits + pool.allocate(-(-(r.prompt_tokens + r.output_tokens - 1) // BS) - len(hits))
        for j in range(len(hits), (r.prompt_tokens + r.output_tokens - 1) // BS):
            pool.cache(held[j], r.keys[j] if j < len(r.keys) else ("output", r.index, j))
        pool.free(held)
        out.append(len(hits) * BS)
    return out


TRACES = st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 24), st.integers(1, 9)), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(TRACES, st.integers(9, 30), st.integers(1, 40))
def test_one_at_a_time_is_the_plain_allocate_and_free_sequence(trace, blocks, budget):
    requests = [req(i, chain, prompt, output) for i, (chain, prompt, output) in enumerate(trace)]
    engine = sim(blocks, max_num_batched_tokens=budget)
    assert [engine.admit(r).cached_tokens for r in requests] == _one_at_a_time(requests, blocks)


@settings(max_examples=150, deadline=None)
@given(TRACES, st.integers(1, 6), st.integers(1, 40))
def test_an_unlimited_pool_loses_nothing_to_requests_in_flight(trace, seqs, budget):
    requests = [req(i, chain, prompt, output) for i, (chain, prompt, output) in enumerate(trace)]
    engine = sim(1000, max_num_seqs=seqs, max_num_batched_tokens=budget, at_once=True)
    assert [engine.admit(r).cached_tokens for r in requests] == _one_at_a_time(requests, 1000)
