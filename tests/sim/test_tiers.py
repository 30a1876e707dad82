"""Tiers: hand-computed cases, an independent reference simulator on random traces, one tier equal to the LRU
curve chunk for chunk (random traces and the Mooncake sample at chunk 512), admission, and --tier parsing."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.errors import BadInputError
from kvcli.sim.curve import HitCurve
from kvcli.sim.stream import ChunkStream, stream_of
from kvcli.sim.tiers import TierSpec, parse_tier, simulate_tiers
from kvcli.store.hashing import chunk_prompt
from kvcli.traces.detect import read_trace

MOONCAKE = Path(__file__).resolve().parents[2] / "sample_traces/mooncake_conversation_head1000.jsonl.gz"
A, B, C, D, E = range(5)
ROOT = b"r" * 16


def test_two_tiers_by_hand():
    # gpu 2 chunks, host 4, chunk size 4: [a,b], [c,d], [a,b,e], then [a,b,e] again as a whole-chunk prompt.
    # r3: gpu lost a,b to c,d; host serves a,b (8 tokens), promoted to the gpu with the new e (gpu keeps a,b).
    # r4: gpu serves a,b, host serves e; the prompt is exactly 3 chunks, so its last token (host's) is computed.
    s = stream_of(4, [([A, B], 9), ([C, D], 9), ([A, B, E], 13), ([A, B, E], 12)])
    t = simulate_tiers(s, [2, 4])
    assert t.hit_chunks == [2, 3]
    assert t.hit_tokens == [8, 11]  # host: 2 chunks in r3 (8) + e in r4 (4 - 1)
    assert t.hit_requests == [1, 2]
    assert t.written_chunks == [2 + 2 + 3 + 1, 2 + 2 + 1 + 0]
    assert (t.new_chunks, t.admitted_new_chunks) == (2 + 2 + 1 + 0, 5)
    one = simulate_tiers(s, [2])
    assert one.hit_tokens == [8]  # only r4's a,b
    assert t.total_hit_tokens >= one.total_hit_tokens


def test_admit_after_two_writes_only_returning_chunks():
    # [a,b], [a,c], [a,b]: a is stored at its 2nd request (r2), b at its 2nd (r3), c never.
    s = stream_of(4, [([A, B], 9), ([A, C], 9), ([A, B], 9)])
    always, admit = simulate_tiers(s, [10]), simulate_tiers(s, [10], admit_after=2)
    assert (always.hit_chunks, always.written_chunks) == ([1 + 2], [2 + 1 + 0])
    assert (admit.hit_chunks, admit.written_chunks) == ([0 + 0 + 1], [0 + 1 + 1])
    assert (admit.new_chunks, admit.admitted_new_chunks) == (2 + 2 + 1, 0 + 1 + 1)


def reference(stream: ChunkStream, capacities: list[int], admit_after: int = 1) -> tuple[list[int], list[int]]:
    """Tiers as lists in recency order (most recent last), every rule spelled out: (hit tokens, written chunks)."""
    tiers: list[list[int]] = [[] for _ in capacities]
    hit, written, count = [0] * len(tiers), [0] * len(tiers), {}
    cs = stream.chunk_size
    b = stream.bounds.tolist()
    for r, n_tok in enumerate(stream.prompt_tokens.tolist()):
        h = stream.ids[b[r]:b[r + 1]].tolist()
        for x in h:
            count[x] = count.get(x, 0) + 1
        start, p, served = [], 0, None
        for i, tier in enumerate(tiers):
            start.append(p)
            while p < len(h) and h[p] in tier:
                hit[i] += cs
                p, served = p + 1, i
        if p == len(h) and h and n_tok == len(h) * cs:
            hit[served] -= 1
        end = p
        while end < len(h) and count[h[end]] >= admit_after:
            end += 1
        for i, tier in enumerate(tiers):
            if not capacities[i]:
                continue  # a tier smaller than one chunk keeps nothing, so writes nothing
            for x in reversed(h[start[i]:end]):  # deepest first: chunk 0 ends the most recent
                if x in tier:
                    tier.remove(x)
                else:
                    written[i] += 1
                tier.append(x)
            del tier[:max(len(tier) - capacities[i], 0)]
    return hit, written


def random_stream(rng: random.Random, requests: int, cs: int = 4) -> ChunkStream:
    """Prefix-chained chunk ids: each request extends a random earlier prompt's prefix or starts a new one."""
    prompts: list[list[int]] = []
    ids: dict[tuple, int] = {}
    out = []
    for _ in range(requests):
        base = rng.choice(prompts) if prompts and rng.random() < 0.7 else []
        keep = base[:rng.randint(0, len(base))]
        prompt = keep + [rng.randrange(1000) for _ in range(rng.randint(0, 4))]
        prompts.append(prompt)
        chunks = [ids.setdefault(tuple(prompt[:k + 1]), len(ids)) for k in range(len(prompt))]
        out.append((chunks, len(prompt) * cs + rng.choice([0, 1])))
    return stream_of(cs, out)


@pytest.mark.parametrize("seed", range(40))
def test_tiers_equal_the_reference_on_random_traces(seed):
    rng = random.Random(seed)
    s = random_stream(rng, 30)
    caps = [rng.randint(0, 6) for _ in range(rng.randint(1, 3))]
    admit = rng.choice([1, 1, 2, 3])
    t = simulate_tiers(s, caps, admit)
    assert (t.hit_tokens, t.written_chunks) == reference(s, caps, admit)
    assert sum(t.hit_chunks) >= simulate_tiers(s, caps[:1], admit).hit_chunks[0]


def curve_and_stream(prompts, cs):
    curve = HitCurve(cs, record=True)
    curve.observe_many([(chunk_prompt(p, cs, ROOT).hashes, None, len(p)) for p in prompts])
    stream = curve.stream()
    assert stream is not None
    return curve.result(sum(map(len, prompts)), 1), stream


@pytest.mark.parametrize("seed", range(10))
def test_one_tier_is_the_lru_curve_at_every_capacity(seed):
    rng = random.Random(seed)
    prompts = [list(range(rng.choice([0, 100, 200]), rng.choice([0, 100, 200]) + rng.randint(1, 40)))
               for _ in range(25)]
    curve, stream = curve_and_stream(prompts, 4)
    for c in range(curve.distinct_chunks + 2):
        assert simulate_tiers(stream, [c]).hit_tokens == [curve.hit_tokens(c)]


def test_one_tier_is_the_lru_curve_on_the_mooncake_sample_at_512():
    requests = list(read_trace(MOONCAKE))[:400]
    curve, stream = curve_and_stream([r.token_ids for r in requests], 512)
    caps = [0, 1, 7, 100, 1000, curve.capacity_for(0.5), curve.capacity_for(0.9), curve.distinct_chunks]
    for c in caps:
        assert simulate_tiers(stream, [c]).hit_tokens == [curve.hit_tokens(c)], c
    two = simulate_tiers(stream, [caps[5], caps[6]])
    assert two.total_hit_tokens >= curve.hit_tokens(caps[6])
    assert two.total_hit_tokens <= curve.unlimited_hit_tokens


def test_parse_tier_by_hand():
    assert parse_tier("gpu=40GB") == TierSpec("gpu", None, 40 * 10**9)
    assert parse_tier("host=2M tokens") == TierSpec("host", 2_000_000, None)
    assert parse_tier("redis=1TiB").bytes == 2**40
    assert parse_tier("gpu=3000").tokens == 3000
    assert (parse_tier("gpu=1").kind, parse_tier("cpu=1").kind, parse_tier("valkey=1").kind) == (
        "gpu", "host", "remote")
    assert TierSpec("gpu", 1000).chunks(512, 7) == 1 and TierSpec("gpu", None, 700).chunks(512, 7) == 100


@pytest.mark.parametrize("text", ["gpu", "=4GB", "gpu=", "gpu=0", "gpu=unlimited", "gpu=64G", "g u=1", "gpu=-1"])
def test_parse_tier_refuses_with_the_option_named(text):
    with pytest.raises(BadInputError, match="--tier"):
        parse_tier(text)


@given(st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True), st.integers(1, 10**12),
       st.sampled_from(["", " tokens", "B", "KiB", "GB"]))
@settings(max_examples=60, deadline=None)
def test_parse_tier_reads_what_it_is_given(name, value, unit):
    spec = parse_tier(f"{name}={value}{unit}")
    scale = {"": 1, " tokens": 1, "B": 1, "KiB": 1024, "GB": 10**9}[unit]
    assert spec.name == name
    assert (spec.bytes if unit not in ("", " tokens") else spec.tokens) == value * scale
