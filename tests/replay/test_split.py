"""One chunk size on several cores (kvcli.replay.split): the plan by hand, its invariants under hypothesis (a
split replay of any trace of chunk chains hits and writes as one process does), and ``--jobs 1/2/3`` on sample
traces against a real Redis server giving the same figures."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_parallel import comparable, differences, run

from kvcli.replay import split as split_mod
from kvcli.replay.results import ReplayConfig
from kvcli.replay.runner import ModelOptions
from kvcli.replay.split import plan_split, read_heads, splits
from kvcli.replay.work import head
from kvcli.store.hashing import PromptChunker
from kvcli.traces.detect import read_trace

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "sample_traces/mooncake_conversation_head1000.jsonl.gz"
CHAT = ROOT / "sample_traces/chat_shared_system.jsonl"

# a split replay cuts its own batches: its round trips differ from one process's (its figures do not)
BATCHING = {"round_trips", "lookup_round_trips", "lookups_pipelined", "lookups_sampled",
            "lookup_round_trips_per_lookup"}


def test_plan_by_hand():
    """Six requests (chunks as letters, prompt tokens beside them), two parts.

    r0 A B C 300 | r1 A B D 300 | r2 A E 200 | r3 A E F 300 | r4 G 100 | r5 A 100

    depth 1: keys A (r0 r1 r2 r3 r5: 1,200 tokens) and G (r4: 100): parts of 1,200 and 100, nothing shared; time
    1,200. depth 2: keys B (r0 r1: 600, first r0), E (r2 r3: 500, first r2), G (r4, shorter than the key: 100),
    A (r5: 100). Heaviest first into the lightest part (ties: the lower part; equal weights by first request):
    B -> 0 (600), E -> 1 (500), G -> 1 (600), A -> 0 (600 = 600: the lower, 700). Part 0 = r0 r1 r5, part 1 =
    r2 r3 r4. Column 0 (the first depth - 1 columns): A is in both parts, first at r0, replayed first; part 0
    replays r1 r5 (400), part 1 r2 r3 r4 (600): time 300 + 600 = 900. depth 3: keys C D E F G A (one request
    each); C -> 0, D -> 1, F -> 0 (300 = 300), E -> 1, G -> 1, A -> 0: parts r0 r3 r5 / r1 r2 r4; shared A (first
    r0), B (r0 and r1: first r0), E (r2 and r3: first r2): replayed first r0 r2 (500), parts 400 and 400: time
    900, not quicker than depth 2 by NEAR: depth 2 stays.
    """
    heads = [[b"A", b"B", b"C"], [b"A", b"B", b"D"], [b"A", b"E"], [b"A", b"E", b"F"], [b"G"], [b"A"]]
    weights = np.array([300, 300, 200, 300, 100, 100])
    split = plan_split(heads, weights, 2)
    assert split is not None
    assert split.depth == 2 and split.groups == 4
    assert [p.tolist() for p in split.parts] == [[0, 1, 5], [2, 3, 4]]
    assert split.first.tolist() == [0] and split.first_tokens == 300
    assert split.tokens == (400, 600) and split.total_tokens == 1300
    assert split.replayed(0).tolist() == [1, 5] and split.replayed(1).tolist() == [2, 3, 4]
    assert split.bound == pytest.approx(1300 / 900)
    # each group's first request, and every request shorter than the key (r4, r5): their heads go to other parts
    assert split.leads.tolist() == [True, False, True, False, True, True]
    # one root: no split at depth 1 and, with every request under A B, none deeper either
    assert plan_split([[b"A", b"B"], [b"A", b"B"]], np.array([10, 10]), 2) is None
    assert plan_split(heads, weights, 1) is None


def replay_hits(order: list[list[bytes]], seen: set) -> tuple[list[int], list[int]]:
    """The unlimited store, request by request: hit chunks (the leading run held) and chunks written."""
    hits, writes = [], []
    for chunks in order:
        k = next((i for i, c in enumerate(chunks) if c not in seen), len(chunks))
        new = [c for c in chunks[k:] if c not in seen]
        seen.update(chunks)
        hits.append(k)
        writes.append(len(set(new)))
    return hits, writes


# requests as paths in a small tree of chunk chains: each request picks a branch per level among a few, so they
# share prefixes of every length; a chunk is named by its whole path (as a prefix-chained hash is)
requests = st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=6), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(paths=requests, parts=st.integers(2, 4), weights=st.lists(st.integers(1, 50), min_size=30, max_size=30))
def test_a_split_replay_hits_and_writes_as_one_process(paths, parts, weights):
    chains = [[bytes(path[:i + 1]) + b"|" for i in range(len(path))] for path in paths]
    w = np.asarray(weights[:len(chains)])
    split = plan_split(chains, w, parts)
    one_hits, one_writes = replay_hits(chains, set())
    if split is None:
        return
    members = np.concatenate(split.parts)
    assert sorted(members.tolist()) == list(range(len(chains)))  # every request in exactly one part
    assert split.tokens == tuple(int(w[split.replayed(k)].sum()) for k in range(len(split.parts)))
    part_of = {int(r): k for k, m in enumerate(split.parts) for r in m}
    holders: dict[bytes, set[int]] = {}
    first: dict[bytes, int] = {}
    for r, chunks in enumerate(chains):
        for c in chunks:
            holders.setdefault(c, set()).add(part_of[r])
            first.setdefault(c, r)
    shared_first = {first[c] for c, held in holders.items() if len(held) > 1}
    assert shared_first <= set(split.first.tolist())  # every shared chunk's first occurrence is replayed first
    # the split replay: the requests replayed first, in order, then each part on its own from there
    hits, writes = [0] * len(chains), [0] * len(chains)
    seen: set = set()
    firsts = split.first.tolist()
    for r, h, n in zip(firsts, *replay_hits([chains[r] for r in firsts], seen)):
        hits[r], writes[r] = h, n
    for k in range(len(split.parts)):
        own = split.replayed(k).tolist()
        for r, h, n in zip(own, *replay_hits([chains[r] for r in own], set(seen))):
            hits[r], writes[r] = h, n
    assert hits == one_hits and writes == one_writes


@pytest.mark.parametrize("trace, chunk_size", [(MOONCAKE, 16), (MOONCAKE, 512), (CHAT, 16)])
def test_a_head_hashes_as_the_start_of_its_request(trace, chunk_size):
    """head() keeps the chunk hashes of the chunks inside it (a hash-id request cut to its first keys, a token
    request to its first tokens), so the parent's plan names the chunks the parts write."""
    chunker = PromptChunker("m", "cl100k_base", chunk_size)
    for request in itertools.islice(read_trace(trace), 40):
        whole = chunker.hashes(request.prompt, request.cache_salt)[0]
        for tokens in (chunk_size, 3 * chunk_size + 5, 2048, 10 ** 6):
            cut = head(request, tokens)
            assert cut.prompt_tokens == min(tokens, request.prompt_tokens)
            assert chunker.hashes(cut.prompt, cut.cache_salt)[0] == whole[:cut.prompt_tokens // chunk_size]
    heads, kept = read_heads(read_trace(trace), 40, chunker)
    assert len(heads) == min(40, len(list(read_trace(trace))))
    assert (kept is not None) == (trace == MOONCAKE)  # hash-id requests are kept


def test_which_configs_split():
    assert splits(ReplayConfig(chunk_sizes=(512,)))
    assert not splits(ReplayConfig(chunk_sizes=(256, 512)))
    assert not splits(ReplayConfig(chunk_sizes=(512,), layouts=("kvcli", "lmcache")))
    assert not splits(ReplayConfig(chunk_sizes=(512,), capacity_tokens=100_000))
    assert not splits(ReplayConfig(chunk_sizes=(512,), namespace="warm"))


# the Mooncake sample (every request under one 512-token block: split below it), a chat trace whose requests share
# a system prompt (text, tokenized: the token-granular radix tree), each against one process
CASES = [(MOONCAKE, 512, 400), (MOONCAKE, 16, 120), (CHAT, 16, None)]


@pytest.mark.parametrize("trace, chunk_size, limit", CASES)
def test_jobs_split_one_chunk_size_with_the_figures_of_one_process(redis_url, trace, chunk_size, limit, monkeypatch):
    monkeypatch.setattr(split_mod, "MIN_BOUND", 1.0)  # small traces: split whatever the speedup
    config = ReplayConfig(chunk_sizes=(chunk_size,), payload="accounted", measure=0, limit=limit)
    options = ModelOptions("cpu", prefill_tps=5000.0)
    one, _ = run(redis_url, config, options, trace, jobs=1)
    reference = strip(comparable(one))
    for jobs in (2, 3):
        many, context = run(redis_url, config, options, trace, jobs=jobs)
        assert context["units"].startswith("this process and")
        assert differences(reference, strip(comparable(many))) == []
        notes = [n for n in many.notes if "parts at once" in n]
        assert len(notes) == 1 and f"in {jobs} parts" in notes[0]
        assert (one.requests, one.skipped_empty, one.span_seconds) == (many.requests, many.skipped_empty,
                                                                         many.span_seconds)
    row = one.per_chunk_size[0]
    assert row.hit_tokens > 0 and row.hit_curve is not None  # figures worth comparing


def strip(rows: dict) -> dict:
    """comparable() without the batching figures."""
    return {layout: [{k: v for k, v in row.items() if k not in BATCHING} for row in table]
            for layout, table in rows.items()}
