"""Reuse beyond a prefix (kvcli/sim/blend.py): blend tokens computed by hand for segmented and chunked requests, the
last token always computed, tenants apart, the per-kind sums, and the options' checks."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.errors import BadInputError
from kvcli.sim.blend import RECOMPUTE_FRACTION, BlendCounter, blend_fraction
from kvcli.traces.request import Request, Segment

# units of a RAG prompt: a system prompt S, passages A and B, questions Q1 and Q2 (their tokens)
UNITS = {"S": ("sys_prompt", [1, 2, 3, 4]), "A": ("passages_ids", [10, 11, 12]),
         "B": ("passages_ids", [20, 21, 22, 23, 24]), "Q1": ("user_input", [30, 31]), "Q2": ("user_input", [40])}


def rag(name: str, parts: list[str], salt: str = "") -> Request:
    """A request made of ``parts`` back to back, one segment each."""
    tokens, segments = [], []
    for part in parts:
        kind, ids = UNITS[part]
        segments.append(Segment(len(tokens), len(tokens) + len(ids), kind, part))
        tokens += ids
    return Request(name, np.array(tokens, dtype="<u4"), cache_salt=salt, segments=tuple(segments))


def test_segments_seen_before_anywhere_count_beyond_the_prefix_by_hand():
    counter = BlendCounter()
    # r1 S A B Q1 (14 tokens): nothing seen yet
    assert counter.add(rag("r1", ["S", "A", "B", "Q1"]), 0) == 0
    # r2 S B A Q2 (13): prefix S (4); B at 4..9 and A at 9..12 were seen in r1, at other positions: 5 + 3; Q2 new
    assert counter.add(rag("r2", ["S", "B", "A", "Q2"]), 4) == 8
    # r3 repeats r1: its prefix figure is 13 (all but the last token), nothing is left to blend
    assert counter.add(rag("r3", ["S", "A", "B", "Q1"]), 13) == 0
    # r4, another tenant: A S Q2 (8) seen by no request of its salt
    assert counter.add(rag("r4", ["A", "S", "Q2"], salt="t2"), 0) == 0
    # r5 B A (8), no prefix: B's 5 and A's 3 were seen, but the last token is computed in any case: 5 + 2
    assert counter.add(rag("r5", ["B", "A"]), 0) == 7
    b = counter.result
    assert (b.requests, b.segmented_requests, b.prompt_tokens, b.prefix_tokens, b.blend_tokens) == (5, 5, 57, 17, 15)
    # 15% of the 15 blended tokens recomputed: 2.25; saved 17 + 15 - 2.25
    assert (b.reusable_tokens, b.recomputed_tokens, b.saved_tokens) == (32, pytest.approx(2.25), pytest.approx(29.75))
    # sys_prompt: 4 in r1-r4, in the prefix of r2 and r3; passages: 8, 8, 8, 3, 8, r3's prefix covers its 8, the
    # blend is r2's 8 and r5's 7; questions: 2, 1, 2, 1, r3's prefix (13) covers the first of its Q1
    assert {kind: (k.prompt, k.prefix, k.blend) for kind, k in b.by_kind.items()} == {
        "sys_prompt": (16, 8, 0), "passages_ids": (35, 8, 15), "user_input": (6, 1, 0)}
    assert b.line() == ("prefix 29.8% + blend 26.3% = 56.1% of 57 prompt tokens reusable; 15% of the blended "
                        "recomputed: 52.2% saved; blend by kind: passages_ids 26.3%")
    assert b.to_dict()["saved_ratio"] == pytest.approx(29.75 / 57)


def test_requests_without_segments_blend_their_full_chunks_by_hand():
    counter = BlendCounter(0.5, chunk_tokens=4)
    r1 = Request("r1", np.arange(1, 13, dtype="<u4"))  # chunks c1 = 1..4, c2 = 5..8, c3 = 9..12
    r2 = Request("r2", np.array([9, 10, 11, 12, 1, 2, 3, 4, 99, 98], dtype="<u4"))  # c3, c1, then 2 tokens
    assert counter.add(r1, 0) == 0
    assert counter.add(r2, 0) == 8  # c3 and c1, seen in r1 at other positions; the 2-token tail is no unit
    assert counter.add(r1, 8) == 3  # a prefix of 8: c3 at 8..12, less the last token
    b = counter.result
    assert (b.segmented_requests, b.prompt_tokens, b.prefix_tokens, b.blend_tokens) == (0, 34, 8, 11)
    assert (b.recomputed_tokens, b.saved_tokens) == (5.5, 13.5)
    assert {kind: (k.prompt, k.prefix, k.blend) for kind, k in b.by_kind.items()} == {
        "chunks": (32, 8, 11), "other": (2, 0, 0)}
    assert b.unit == "full 4-token chunks"


def test_a_prefix_figure_outside_the_prompt_is_a_bug():
    with pytest.raises(ValueError):
        BlendCounter().add(rag("r", ["S"]), 5)


@pytest.mark.parametrize("reuse, recompute, expected", [
    ("prefix", None, None), ("blend", None, RECOMPUTE_FRACTION), ("blend", 0, 0.0), ("blend", 1, 1.0),
    ("blend", 0.3, 0.3)])
def test_reuse_options(reuse, recompute, expected):
    assert blend_fraction(reuse, recompute) == expected


@pytest.mark.parametrize("reuse, recompute, message", [
    ("both", None, "--reuse must be one of prefix, blend, got 'both'"),
    ("prefix", 0.2, "--blend-recompute applies with --reuse blend"),
    ("blend", 1.5, "--blend-recompute must be a number in [0, 1] (the share of blended tokens recomputed; "
                   "CacheBlend in LMCache: 0.15), got 1.5"),
    ("blend", float("nan"), "--blend-recompute must be a number in [0, 1] (the share of blended tokens recomputed; "
                            "CacheBlend in LMCache: 0.15), got nan"),
])
def test_bad_reuse_options_are_refused_naming_the_option(reuse, recompute, message):
    with pytest.raises(BadInputError) as info:
        blend_fraction(reuse, recompute)
    assert str(info.value) == message


names = st.sampled_from(list(UNITS))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(names, max_size=5), st.integers(0, 20), st.sampled_from(["", "t"])), max_size=8))
def test_blend_is_the_tokens_of_units_seen_earlier_beyond_the_prefix(rows):
    """Against a plain reading of the rule (units as tuples of tokens, no digests): per request, the tokens of its
    units that an earlier request of its salt held, inside [prefix, n - 1); the per-kind sums are the totals."""
    counter, seen = BlendCounter(), set()
    for i, (parts, prefix, salt) in enumerate(rows):
        request = rag(f"r{i}", parts, salt)
        n = request.prompt_tokens
        prefix = min(prefix, n)
        expected = sum(max(0, min(s.end, max(prefix, n - 1)) - max(s.start, prefix))
                       for s in request.segments if (salt, tuple(UNITS[s.key][1])) in seen)
        assert counter.add(request, prefix) == expected
        assert prefix + expected <= max(n - 1, prefix)
        seen.update((salt, tuple(UNITS[p][1])) for p in parts)
    b = counter.result
    assert sum(k.prompt for k in b.by_kind.values()) == b.prompt_tokens
    assert sum(k.prefix for k in b.by_kind.values()) == b.prefix_tokens
    assert sum(k.blend for k in b.by_kind.values()) == b.blend_tokens
