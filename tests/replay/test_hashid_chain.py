"""A hash-id prompt's chunk hashes computed from its block keys (kvcli.store.hashing.block_hashes) against the
token path: the same chunks equal and distinct, on the sample traces, every chunk size and generated shapes; the
same replay figures as the trace's token ids replayed as a token-id trace; warm, inspect and replay agree."""
from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.live.warm import WarmConfig, warm
from kvcli.model.llama import build_model
from kvcli.replay import prefetch
from kvcli.store.hashing import PromptChunker, block_hashes, block_root, block_signatures, namespace_root
from kvcli.traces import request as request_module
from kvcli.traces.detect import read_trace
from kvcli.traces.request import BlockKeys, HashIdRequest
from kvcli.traces.synth import block_token_ids

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
MOONCAKE = SAMPLES / "mooncake_conversation_head1000.jsonl.gz"
BAILIAN = SAMPLES / "bailian_handmade.jsonl"
CHUNK_SIZES = (16, 64, 256, 512, 1024, 48, 100, 700)


def runs(*pairs: tuple[int, int]) -> bytes:
    """A signature written by hand: ``(first x, length)`` runs as little-endian uint64 pairs."""
    return b"".join(x.to_bytes(8, "little") + n.to_bytes(8, "little") for x, n in pairs)


def signatures(keys, block_tokens: int, length: int, chunk_size: int) -> list[bytes]:
    runs, offsets = block_signatures(np.asarray(keys, np.uint64), block_tokens, length, chunk_size)
    assert len(offsets) == length // chunk_size + 1 and offsets[-1] == len(runs)
    return [runs[a:b] for a, b in zip(offsets, offsets[1:])]


def test_signatures_and_hashes_by_hand():
    """Keys [5, 6, 9] of 4 tokens, 10 tokens (the last block partial): x = key * 4 + offset is 20..23, 24..27, 36,
    37. Chunks of 3: x 20-22 (one run), 23-25 (5 then 6 follow on: one run), 26, 27, 36 (two runs); token 9 is
    in no full chunk."""
    assert signatures([5, 6, 9], 4, 10, 3) == [runs((20, 3)), runs((23, 3)), runs((26, 2), (36, 1))]
    root = block_root("m", "t", "salt")
    h0 = xxhash.xxh3_128_digest(root + runs((20, 3)))
    h1 = xxhash.xxh3_128_digest(h0 + runs((23, 3)))
    h2 = xxhash.xxh3_128_digest(h1 + runs((26, 2), (36, 1)))
    hashes, digests = block_hashes(np.array([5, 6, 9], np.uint64), 4, 10, 3, root)
    assert hashes == [h0, h1, h2]
    assert digests == [xxhash.xxh3_64_digest(s) for s in (runs((20, 3)), runs((23, 3)), runs((26, 2), (36, 1)))]
    assert root == xxhash.xxh3_128_digest(b"kvcli-block-id-hash/v1:splitmix64-lemire-100256\0m\0t\0salt")
    assert root != namespace_root("m", "t", "salt")


def test_chunks_larger_equal_and_smaller_than_a_block_by_hand():
    # larger: a chunk of two blocks is one run when the keys follow on, one per key otherwise
    assert signatures([5, 6, 9, 10], 4, 16, 8) == [runs((20, 8)), runs((36, 8))]
    assert signatures([5, 7], 4, 8, 8) == [runs((20, 4), (28, 4))]
    # equal, and smaller (two chunks a block), and not dividing it (chunk 1 spans blocks 0 and 1)
    assert signatures([5, 7], 4, 8, 4) == [runs((20, 4)), runs((28, 4))]
    assert signatures([5, 7], 4, 8, 2) == [runs((20, 2)), runs((22, 2)), runs((28, 2)), runs((30, 2))]
    assert signatures([5, 7], 4, 8, 3) == [runs((20, 3)), runs((23, 1), (28, 2))]
    # no full chunk, and a prompt shorter than its keys cover (the partial last block)
    assert signatures([5], 4, 3, 4) == []
    assert signatures([5, 7, 8], 4, 9, 9) == [runs((20, 4), (28, 5))]
    with pytest.raises(ValueError, match="2 block keys of 4 tokens for a prompt of 9 tokens"):
        signatures([5, 7], 4, 9, 3)


def same_partition(pairs: list[tuple[bytes, bytes]]) -> bool:
    """Whether the two columns name the same chunks equal and distinct (a one-to-one map between them)."""
    return len(set(pairs)) == len({a for a, _ in pairs}) == len({b for _, b in pairs})


def token_and_id_hashes(requests, chunk_size: int) -> tuple[list, list]:
    """Every full chunk's (token-path hash, id-path hash) and (token digest, id digest) over ``requests``."""
    chunker, hashes, digests = PromptChunker("m", "t", chunk_size), [], []
    for r in requests:
        by_tokens, by_ids = chunker.chunk(r.token_ids, r.cache_salt), chunker.chunk(r.prompt, r.cache_salt)
        assert by_ids.tokens is None and len(by_ids.hashes) == len(by_tokens.hashes) == r.prompt_tokens // chunk_size
        hashes += zip(by_tokens.hashes, by_ids.hashes)
        digests += zip(by_tokens.digests, by_ids.digests)
    return hashes, digests


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_the_sample_traces_chunks_are_equal_exactly_where_their_tokens_are(chunk_size):
    """The Bailian sample whole and the Mooncake sample's first 150 requests (all 1,000 at every size, and the
    replay's figures before and after: docs/measurements.md)."""
    requests = list(read_trace(BAILIAN)) + list(read_trace(MOONCAKE))[:150]
    hashes, digests = token_and_id_hashes(requests, chunk_size)
    assert hashes and same_partition(hashes) and same_partition(digests)
    assert len({a for a, _ in hashes}) < len(hashes)  # some chunks are shared


_key = st.integers(0, 12)
_request = st.tuples(st.sampled_from([1, 2, 3, 4, 8, 16]), st.lists(_key, min_size=1, max_size=12),
                     st.integers(0, 15), st.integers(0, 4), st.sampled_from(["", "t"]))


@settings(max_examples=120, deadline=None)
@given(records=st.lists(_request, min_size=1, max_size=12), chunk_size=st.integers(4, 40))
def test_generated_traces_give_the_token_paths_equal_chunks(records, chunk_size):
    """Requests of mixed block sizes (1 to 16 tokens: ``key * B + j`` of two sizes can coincide, and a run of
    following keys at one size can equal one key at another), each a prefix of an earlier request (shared
    prefixes) plus keys drawn from a few (repeated ids, following keys), its last block partial; chunk sizes
    below, at and above the block size (from 4 tokens: the token path's chance collisions stay near 100256**-4)."""
    requests = []
    for block_tokens, keys, drop, prefix_of, salt in records:
        if requests and prefix_of < len(requests):
            earlier = requests[prefix_of].blocks
            if earlier.block_tokens == block_tokens:
                keys = [int(k) for k in earlier.keys] + keys
        keys = np.asarray(keys, np.uint64) * np.uint64(3 if drop % 2 else 1)  # some keys far apart, some following
        length = max(0, len(keys) * block_tokens - drop % block_tokens)
        requests.append(HashIdRequest(f"r{len(requests)}", blocks=BlockKeys(keys, block_tokens, length),
                                      cache_salt=salt))
    hashes, digests = token_and_id_hashes(requests, chunk_size)
    assert same_partition(hashes) and same_partition(digests)


def test_across_block_sizes_following_keys_equal_one_larger_key():
    """Keys 2, 3 of 4 tokens are x 8..15, as key 1 of 8 tokens: the same tokens, so the same chunk of 8."""
    a = HashIdRequest("a", blocks=BlockKeys(np.array([2, 3], np.uint64), 4, 8))
    b = HashIdRequest("b", blocks=BlockKeys(np.array([1], np.uint64), 8, 8))
    assert np.array_equal(a.token_ids, b.token_ids)
    chunker = PromptChunker("m", "t", 8)
    assert chunker.chunk(a.prompt).hashes == chunker.chunk(b.prompt).hashes


def test_hash_id_requests_are_not_synthesized_to_be_read_hashed_and_bounded(monkeypatch):
    """Reading, the upper bound and the chunk hashes of the index-only path use only the block keys; the token ids
    are synthesized when first read, then kept."""
    calls = []
    real = request_module.block_token_ids
    monkeypatch.setattr(request_module, "block_token_ids", lambda *a: calls.append(a) or real(*a))
    from kvcli.sim.upper_bound import UpperBound

    requests = list(read_trace(MOONCAKE))[:40]
    chunker = PromptChunker("m", "t", 512)
    items = list(prefetch.hashed_here(lambda: requests, 40, [chunker], UpperBound(), set()))
    assert len(items) == 40 and not calls
    tokens = requests[0].token_ids
    assert requests[0].token_ids is tokens and len(calls) == 1
    assert np.array_equal(tokens, block_token_ids(requests[0].blocks.keys, 512, requests[0].prompt_tokens))


def as_token_trace(path: Path, out: Path, limit: int | None = None) -> Path:
    """The requests of hash-id trace ``path`` as a native token-id trace: their synthesized token ids, times (s)
    and sessions (hashed by the token path; its upper bound by the token radix)."""
    with out.open("w") as f:
        for r in list(read_trace(path))[:limit]:
            f.write(json.dumps({"id": r.id, "token_ids": r.token_ids.tolist(), "timestamp": r.timestamp,
                                "session_id": r.session_id}) + "\n")
    return out


FIGURES = ("prompt_tokens", "hit_tokens", "hit_tokens_unlimited", "upper_bound_tokens", "objects_created",
           "metadata_entries", "metadata_bytes_written",
           "payload_bytes_accounted", "chunks_hit", "chunks_written")


def figures(redis_url, trace: Path, sizes: str, *more) -> dict:
    out = CliRunner().invoke(app, ["replay", str(trace), "--measure", "0", "--prefill-tps", "1000", "--payload",
                                   "accounted", "--no-curve", "--json", "--redis-url", redis_url, "--jobs", "1",
                                   "--chunk-sizes", sizes, *more])
    assert out.exit_code == 0, out.output
    (result,) = json.loads(out.stdout)["traces"]
    return {r["chunk_size"]: {k: r[k] for k in FIGURES} for r in result["per_chunk_size"]}


@pytest.mark.single_server("the hashes, not the server, are under test; the store's cluster tests run both paths")
def test_a_hash_id_replay_equals_its_token_ids_replayed(tmp_path, redis_url):
    """Hit tokens, upper bound, objects, bytes and chunk counts of the Bailian sample and the Mooncake sample's
    first 16 requests, against the same token ids as a token-id trace, at chunk sizes equal to, smaller and larger
    than their blocks (16 and 512 tokens), dividing them or not (the whole samples at every size of CHUNK_SIZES,
    before and after: docs/measurements.md)."""
    sizes = "16,48,512,700"
    for path, limit in ((BAILIAN, None), (MOONCAKE, 16)):
        source = path
        if limit is not None:
            with gzip.open(path, "rt") as f:
                source = tmp_path / "head.jsonl"
                source.write_text("".join(f.readline() for _ in range(limit)))
        tokens = as_token_trace(source, tmp_path / "tokens.jsonl")
        by_ids, by_tokens = figures(redis_url, source, sizes), figures(redis_url, tokens, sizes)
        assert by_ids == by_tokens
        assert any(f["hit_tokens"] for f in by_ids.values())


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", device="cpu")


def test_warm_inspect_and_replay_of_a_hash_id_trace_agree(tmp_path, redis_url, redis_client, model):
    """A Bailian trace warmed (its chunks hashed from its keys, its KV computed on its synthesized tokens), then
    inspected per request and replayed against the warmed namespace: every full chunk hits."""
    trace = tmp_path / "b.jsonl"
    trace.write_text(
        '{"chat_id": 1, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 40, "hash_ids": [1, 2, 3]}\n'
        '{"chat_id": 2, "parent_chat_id": 1, "timestamp": 2.0, "input_length": 70, "hash_ids": [1, 2, 3, 4, 5]}\n')
    requests = list(read_trace(trace))
    result = warm(redis_client, requests, model, WarmConfig("hw", (16,)))
    assert result.total("chunks_written") == 4 and result.per_size[0].full_chunks == 2 + 4
    res = CliRunner().invoke(app, ["inspect", "--request", f"{trace}:2", "--model", "tiny", "--chunk-size", "16",
                                   "--namespace", "hw", "--json", "--redis-url", redis_url])
    assert res.exit_code == 0, res.output
    (m,) = json.loads(res.stdout)["chunk_maps"]
    assert (m["hit_tokens"], m["prefill_tokens"], m["break_index"]) == (64, 6, None)
    out = CliRunner().invoke(app, ["replay", str(trace), "--model", "tiny", "--measure", "0", "--prefill-tps",
                                   "1000", "--payload", "accounted", "--no-curve", "--json", "--redis-url", redis_url,
                                   "--jobs", "1", "--chunk-sizes", "16", "--namespace", "hw"])
    assert out.exit_code == 0, out.output
    (row,) = json.loads(out.stdout)["traces"][0]["per_chunk_size"]
    assert (row["chunks_hit"], row["hit_tokens"], row["chunks_written"]) == (6, 32 + 64, 0)


def test_inspect_request_reads_the_trace_with_the_hash_id_options(tmp_path, redis_url, redis_client, model):
    """A Mooncake-shaped trace of 16-token ids (--hash-block-tokens 16) warmed, then one request mapped by inspect
    read the same way: its 4 full chunks hit (64 of 70 tokens). Its bad first record is passed over with
    --skip-bad-records, and without it stops the read (exit 2, naming file and line)."""
    from kvcli.traces.hashids import TraceFormat

    trace = tmp_path / "m.jsonl"
    trace.write_text('{"timestamp": 1000, "input_length": 40, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 1000, "input_length": 40, "hash_ids": [1, 2, 3]}\n'
                     '{"timestamp": 2000, "input_length": 70, "hash_ids": [1, 2, 3, 4, 5]}\n')
    fmt = TraceFormat(block_tokens=16, skip_bad_records=True)
    warm(redis_client, list(read_trace(trace, fmt)), model, WarmConfig("m16", (16,)))
    args = ["inspect", "--request", f"{trace}:3", "--model", "tiny", "--chunk-size", "16", "--namespace", "m16",
            "--json", "--redis-url", redis_url]
    res = CliRunner().invoke(app, [*args, "--hash-block-tokens", "16", "--skip-bad-records"])
    assert res.exit_code == 0, res.output
    (m,) = json.loads(res.stdout)["chunk_maps"]
    assert (m["hit_tokens"], m["prefill_tokens"]) == (64, 6)
    res = CliRunner().invoke(app, [*args, "--hash-block-tokens", "16"])
    assert res.exit_code == 2 and f"{trace}:1: 2 hash_ids for input_length 40 at 16 tokens per id" in res.output


def test_a_pickled_hash_id_request_carries_its_keys_not_tokens_it_never_synthesized(monkeypatch):
    """Pickling a request read from a hash-id trace synthesizes nothing and sends its block keys only; the copy
    synthesizes the same token ids when read, and one synthesized before pickling arrives with them."""
    calls = []
    real = request_module.block_token_ids
    monkeypatch.setattr(request_module, "block_token_ids", lambda *a: calls.append(a) or real(*a))
    lazy, read = list(read_trace(MOONCAKE))[:2]
    tokens = read.token_ids
    assert len(calls) == 1
    copy = pickle.loads(pickle.dumps(lazy))
    assert len(calls) == 1 and len(pickle.dumps(lazy)) < 1000 < 4 * lazy.prompt_tokens
    assert (copy.id, copy.prompt_tokens, copy.timestamp) == (lazy.id, lazy.prompt_tokens, lazy.timestamp)
    assert np.array_equal(copy.token_ids, lazy.token_ids) and len(calls) == 3
    again = pickle.loads(pickle.dumps(read))
    assert again.token_ids is not tokens and np.array_equal(again.token_ids, tokens) and len(calls) == 3
