"""The upper bound of hash-id requests matched on their block keys (BlockTrie, UpperBound) equals the token radix."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.sim.upper_bound import BlockTrie, RadixUpperBound, UpperBound
from kvcli.traces.request import BlockKeys, Request
from kvcli.traces.synth import block_token_ids


def _request(keys, block_tokens: int, length: int, salt: str = "", blocks: bool = True) -> Request:
    keys = np.asarray(keys, np.uint64)
    tokens = block_token_ids(keys, block_tokens, length)
    return Request("r", tokens, cache_salt=salt, blocks=BlockKeys(keys, block_tokens, length) if blocks else None)


def _both(requests: list[Request]) -> tuple[list[int], list[int]]:
    radix, bound = RadixUpperBound(), UpperBound()
    return ([radix.match_and_insert(r.token_ids, r.cache_salt) for r in requests],
            [bound.match_request(r) for r in requests])


def _first_token(key: int, block_tokens: int) -> int:
    return int(block_token_ids(np.array([key], np.uint64), block_tokens, 1)[0])


def test_whole_blocks_partial_last_blocks_and_salts_by_hand():
    # B = 8. r0: keys 1 2 3, 20 tokens (blocks of 8, 8, 4). r1: the same keys, 24 tokens: shares r0's 20.
    # r2: keys 1 2, 16 tokens: all 16. r3: keys 1 9 (9 starts with another token than 2): 8.
    # r4: keys 1 2 3, 24 tokens: r1 held all 8 of block 3: 24. r5: r4 under another salt: 0.
    b = 8
    assert _first_token(9, b) != _first_token(2, b)
    requests = [_request([1, 2, 3], b, 20), _request([1, 2, 3], b, 24), _request([1, 2], b, 16),
                _request([1, 9], b, 16), _request([1, 2, 3], b, 24), _request([1, 2, 3], b, 24, salt="t")]
    radix, trie = _both(requests)
    assert trie == radix == [0, 20, 16, 8, 24, 0]


def test_a_block_of_another_key_that_starts_with_the_same_tokens_is_matched_token_by_token():
    # Keys whose blocks share their first token (found by search: 100,256 first tokens, so among 2,000 keys some
    # pair shares one): after key 1, the second block of r1 matches r0's for exactly the leading tokens the two
    # synthesized blocks share, which the trie finds by comparing tokens (its tail correction).
    b = 16
    seen: dict[int, int] = {}
    pair = None
    for key in range(2, 200_000):
        first = _first_token(key, b)
        if first in seen:
            pair = (seen[first], key)
            break
        seen[first] = key
    assert pair is not None
    x, y = (block_token_ids(np.array([k], np.uint64), b, b) for k in pair)
    shared = int(np.argmax(x != y))  # leading tokens the two blocks share: at least the first
    assert 1 <= shared < b
    radix, trie = _both([_request([1, pair[0]], b, 32), _request([1, pair[1]], b, 32)])
    assert trie == radix == [0, b + shared]


def test_block_sizes_whose_tokens_coincide_move_the_bound_to_the_radix_tree():
    # Token j of key k at block size B is a function of k * B + j: keys 2, 3 at B = 8 give the tokens of key 1 at
    # B = 16. The trie cannot see that; the bound moves everything to the radix tree and finds all 16.
    first, second = _request([2, 3], 8, 16), _request([1], 16, 16)
    assert np.array_equal(first.token_ids, second.token_ids)
    bound = UpperBound()
    assert [bound.match_request(first), bound.match_request(second), bound.match_request(_request([1], 16, 16))] \
        == [0, 16, 16]


def test_requests_without_keys_and_small_blocks_use_the_radix_tree():
    bound = UpperBound()
    assert [bound.match_request(_request([5, 6], 4, 8)), bound.match_request(_request([5, 7], 4, 8))] == [0, 4]
    plain = UpperBound()
    assert [plain.match_request(_request([5, 6], 8, 16, blocks=False)),
            plain.match_request(_request([5, 6], 8, 12, blocks=False))] == [0, 12]
    with pytest.raises(ValueError, match="at least 8 tokens"):
        BlockTrie(4)
    with pytest.raises(ValueError, match="2 block keys for 20 tokens"):
        BlockTrie(8).match_and_insert(np.array([1, 2], np.uint64), 20)


_records = st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=6), st.integers(0, 7),
                              st.sampled_from(["", "t"])), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(block_tokens=st.sampled_from([1, 2, 8, 16]), records=_records, mixed=st.booleans())
def test_the_bound_equals_the_radix_tree_on_random_hash_id_traces(block_tokens, records, mixed):
    # Small key alphabets (many shared prefixes), partial last blocks, two salts; with ``mixed``, every third request
    # has another block size (the move to the radix tree mid-trace).
    requests = []
    for k, (keys, short, salt) in enumerate(records):
        b = 16 if mixed and k % 3 == 2 and block_tokens == 8 else block_tokens
        length = max(1, len(keys) * b - min(short, b - 1))
        requests.append(_request(keys, b, length, salt))
    radix, trie = _both(requests)
    assert trie == radix
