"""Hash-id traces with explicit block semantics: Bailian, block_size records, declared options, Claude-Code
sessions; every expected value is computed by hand."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.errors import BadInputError
from kvcli.traces.detect import detect_format, outline_trace, read_trace, trace_note
from kvcli.traces.hashids import TraceFormat
from kvcli.traces.synth import block_token_ids


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def bailian(chat, parent, t, length, ids, **more):
    return {"chat_id": chat, "parent_chat_id": parent, "timestamp": t, "input_length": length, "output_length": 7,
            "type": "text", "turn": 1 if parent == -1 else 2, "hash_ids": ids, **more}


# The two records: one shared 16-token block.
TWO = [bailian(1, -1, 10.0, 40, [1, 2, 3]), bailian(2, 1, 20.0, 70, [1, 9, 10, 11, 12])]


def test_bailian_is_detected_by_its_own_fields_and_read_at_16_tokens_in_seconds(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", TWO)
    assert detect_format(path) == "bailian"
    a, b = read_trace(path)
    assert (len(a.token_ids), len(b.token_ids)) == (40, 70)
    assert (a.timestamp, b.timestamp) == (10.0, 20.0)
    assert (a.id, b.id, a.session_id, b.session_id, a.output_length) == ("1", "2", "1", "1", 7)
    assert np.array_equal(a.token_ids[:16], b.token_ids[:16])
    assert not np.array_equal(a.token_ids[16:32], b.token_ids[16:32])
    assert [o.prompt_tokens for o in outline_trace(path)] == [40, 70]
    assert trace_note(path) == ("read as a bailian hash-id trace: 16 tokens per hash id (the format's), "
                                "timestamps in s (the format's), sessions: the root of each parent_chat_id chain")


def test_bailian_sessions_follow_the_parent_chain(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", [bailian(5, -1, 0, 16, [1]), bailian(6, 5, 1, 16, [1]),
                                              bailian(7, 6, 2, 16, [1]), bailian(8, -1, 3, 16, [2])])
    assert [r.session_id for r in read_trace(path)] == ["5", "5", "5", "8"]


@pytest.mark.parametrize("detected, record", [
    ("bailian", {"chat_id": 1, "input_length": 1, "hash_ids": [0]}),
    ("bailian", {"turn": 1, "input_length": 1, "hash_ids": [0]}),
    ("hash-ids", {"block_size": 32, "input_length": 1, "hash_ids": [0]}),
    ("mooncake", {"timestamp": 0, "input_length": 1, "hash_ids": [0]}),
    ("claude-code", {"id": "s", "block_size": 64, "hash_id_scope": "local", "requests": []}),
])
def test_detection(tmp_path, detected, record):
    assert detect_format(write_jsonl(tmp_path / "t.jsonl", [record])) == detected


@pytest.mark.parametrize("record, fmt, message", [
    (bailian(1, -1, 0, 40, [1, 2]), "auto",
     "2 hash_ids for input_length 40 at 16 tokens per id: expected ceil(40/16) = 3"),
    (bailian(1, -1, 0, 40, [1, 2, 3, 4]), "auto",
     "4 hash_ids for input_length 40 at 16 tokens per id: expected ceil(40/16) = 3"),
    ({"block_size": 8, "input_length": 17, "hash_ids": [1, 2]}, "auto",
     "2 hash_ids for input_length 17 at 8 tokens per id: expected ceil(17/8) = 3"),
    ({"block_size": 8, "input_length": 16, "hash_ids": [1, 2]}, TraceFormat(block_tokens=16),
     "block_size 8 contradicts --hash-block-tokens 16"),
    ({"block_size": 0, "input_length": 16, "hash_ids": [1]}, "auto",
     "block_size must be an integer in [1, 1,048,576], got 0"),
    ({"block_size": 2**31, "input_length": 5, "hash_ids": [3]}, "auto",  # once: all memory for a 5-token prompt
     "block_size must be an integer in [1, 1,048,576], got 2147483648"),
    ({"input_length": 16, "hash_ids": [1]}, "hash-ids",
     "a hash-id record without block_size: its tokens per hash id are unknown; pass --hash-block-tokens B"),
    (bailian(1, -1, 0, 16, [-1]), "auto", "hash_ids[0] = -1 is not an integer in [0, 2**64)"),
    (bailian(1, -1, 0, 16, [2**64]), "auto", "hash_ids[0] = 18446744073709551616 is not an integer in [0, 2**64)"),
    (bailian(1, -1, 0, 32, [1, "2"]), "auto", "hash_ids[1] = '2' is not an integer in [0, 2**64)"),
    (bailian(1, -1, -1, 16, [1]), "auto", "timestamp must be a finite number >= 0, got -1"),
])
def test_a_record_that_fails_its_checks_names_file_and_line(tmp_path, record, fmt, message):
    first = {"block_size": 16, "input_length": 16, "hash_ids": [1]} if fmt == "hash-ids" else bailian(9, -1, 0, 16, [1])
    path = write_jsonl(tmp_path / "t.jsonl", [first, record])
    with pytest.raises(BadInputError) as info:
        list(read_trace(path, fmt))
    assert str(info.value) == f"{path}:2: {message}"
    with pytest.raises(BadInputError):
        list(outline_trace(path, fmt))


def test_skip_bad_records_skips_and_counts(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [TWO[0], bailian(3, -1, 15, 40, [1, 2]), TWO[1]])
    fmt = TraceFormat(skip_bad_records=True)
    assert [r.id for r in read_trace(path, fmt)] == ["1", "2"]
    assert [o.prompt_tokens for o in outline_trace(path, fmt)] == [40, 70]
    assert trace_note(path, fmt).endswith(
        "; 1 records failed their checks and were skipped (--skip-bad-records), the first: "
        f"{path}:2: 2 hash_ids for input_length 40 at 16 tokens per id: expected ceil(40/16) = 3")


def test_skip_bad_records_skips_a_line_that_is_not_json(tmp_path):
    """A log cut mid-line (its last record half written): the records before it, and the note names the line."""
    path = write_jsonl(tmp_path / "t.jsonl", TWO)
    with path.open("a") as f:
        f.write('{"chat_id": 3, "parent_chat_id": -1, "timestamp": 15, "input_length": 40, "hash_ids": [1,\n')
    with pytest.raises(BadInputError, match=r"t\.jsonl:3: invalid JSON"):
        list(read_trace(path))
    fmt = TraceFormat(skip_bad_records=True)
    assert [r.id for r in read_trace(path, fmt)] == ["1", "2"]
    assert [o.prompt_tokens for o in outline_trace(path, fmt)] == [40, 70]
    assert trace_note(path, fmt).endswith("; 1 records failed their checks and were skipped (--skip-bad-records), "
                                          f"the first: {path}:3: invalid JSON: Expecting value (column 90)")


def test_declared_block_size_and_unit_apply_to_a_mooncake_shaped_trace(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [{"timestamp": 1500, "input_length": 40, "hash_ids": [1, 2, 3]}])
    with pytest.raises(BadInputError, match=r"m\.jsonl:1: 3 hash_ids for input_length 40 at 8 tokens per id: "
                                            r"expected ceil\(40/8\) = 5"):
        list(read_trace(path, TraceFormat(block_tokens=8)))
    (r,) = read_trace(path, TraceFormat(block_tokens=16))
    assert (len(r.token_ids), r.timestamp) == (40, 1.5)  # Mooncake's ms stays the default
    (r,) = read_trace(path, TraceFormat(block_tokens=16, timestamp_unit="s"))
    assert r.timestamp == 1500.0
    assert "16 tokens per hash id (--hash-block-tokens), timestamps in s (--timestamp-unit)" in trace_note(
        path, TraceFormat(block_tokens=16, timestamp_unit="s"))
    assert trace_note(path) == ("read as a mooncake hash-id trace: 512 tokens per hash id (the format's), "
                                "timestamps in ms (the format's), sessions: session_id when present (a delay row: "
                                "its session's previous turn's time + delay, the earliest it can come; a group_id "
                                "or context_mode session: delta rows, each turn's prompt the previous one's, its "
                                "response and the new tokens)")


def test_one_synthesis_for_every_block_size_mooncake_included(tmp_path):
    """A Mooncake trace read by the hash-id reader at 512 tokens gives exactly the Mooncake reader's tokens."""
    ids = [7, 3, 9]
    path = write_jsonl(tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 1100, "hash_ids": ids}])
    (own,) = read_trace(path)
    (declared,) = read_trace(path, TraceFormat(timestamp_unit="ms"))
    assert np.array_equal(own.token_ids, declared.token_ids)
    assert np.array_equal(own.token_ids, block_token_ids(np.array(ids, dtype=np.uint64), 512, 1100))


def test_drop_tail_block_makes_the_last_block_private(tmp_path):
    same = bailian(1, -1, 0, 40, [1, 2, 3])
    path = write_jsonl(tmp_path / "t.jsonl", [same, {**same, "chat_id": 2}])
    a, b = read_trace(path)
    assert np.array_equal(a.token_ids, b.token_ids)
    a, b = read_trace(path, TraceFormat(drop_tail_block=True))
    assert np.array_equal(a.token_ids[:32], b.token_ids[:32]) and not np.array_equal(a.token_ids[32:],
                                                                                      b.token_ids[32:])
    assert len(a.token_ids) == len(b.token_ids) == 40
    again = list(read_trace(path, TraceFormat(drop_tail_block=True)))
    assert np.array_equal(again[1].token_ids, b.token_ids)  # every read gives the same tokens


def test_records_of_another_block_size_get_a_key_space_of_their_own(tmp_path):
    # Unfolded, id 2 at 8 tokens would be the first half of id 1 at 16 (tokens come from key * B + j). The first
    # record's size keeps its ids as keys; the others' ids are folded with the size: equal among themselves only.
    path = write_jsonl(tmp_path / "t.jsonl", [
        {"timestamp": 0, "block_size": 16, "input_length": 32, "hash_ids": [1, 2]},
        {"timestamp": 1, "block_size": 8, "input_length": 32, "hash_ids": [2, 3, 4, 5]},
        {"timestamp": 2, "block_size": 8, "input_length": 24, "hash_ids": [2, 3, 4]}])
    a, b, c = read_trace(path)
    assert np.array_equal(a.token_ids, block_token_ids(np.array([1, 2], np.uint64), 16, 32))
    assert np.array_equal(a.blocks.keys, [1, 2]) and b.blocks.block_tokens == 8
    assert not np.array_equal(a.token_ids[:16], b.token_ids[:16])  # no longer the same tokens
    assert int(np.argmax(a.token_ids != b.token_ids)) < 3  # at most a chance first token or two in common
    assert np.array_equal(b.token_ids[:24], c.token_ids) and np.array_equal(b.blocks.keys[:3], c.blocks.keys)
    again = list(read_trace(path))
    assert all(np.array_equal(x.token_ids, y.token_ids) for x, y in zip(again, (a, b, c)))


def test_hash_id_options_on_another_format_are_said_to_change_nothing(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"token_ids": [1, 2, 3]}])
    assert trace_note(path) is None
    assert trace_note(path, TraceFormat(timestamp_unit="s")) == (
        "--timestamp-unit applies to hash-id traces only: this native trace is read without them")
    assert trace_note(path, TraceFormat(block_tokens=4, drop_tail_block=True)) == (
        "--hash-block-tokens and --drop-tail-block apply to hash-id traces only: this native trace is read without "
        "them")


def test_ids_beyond_the_key_range_are_folded_deterministically(tmp_path):
    big = 2**64 - 5
    path = write_jsonl(tmp_path / "t.jsonl", [bailian(1, -1, 0, 32, [big, 1]), bailian(2, -1, 1, 32, [big, 2])])
    a, b = read_trace(path)
    assert np.array_equal(a.token_ids[:16], b.token_ids[:16])
    assert not np.array_equal(a.token_ids[16:], b.token_ids[16:])


def test_claude_code_ids_are_scoped_per_session(tmp_path):
    rows = [{"id": "s1", "block_size": 64, "hash_id_scope": "local",
             "requests": [{"t": 0.0, "in": 128, "out": 3, "hash_ids": [0, 1]},
                          {"t": 2.5, "in": 130, "out": 4, "hash_ids": [0, 1, 2]}]},
            {"id": "s2", "block_size": 64, "hash_id_scope": "local",
             "requests": [{"t": 0.0, "in": 128, "out": 3, "hash_ids": [0, 1]}]}]
    path = write_jsonl(tmp_path / "cc.jsonl", rows)
    a, b, c = read_trace(path)
    assert [(r.id, r.session_id, r.timestamp, r.output_length, len(r.token_ids)) for r in (a, b, c)] == [
        ("s1:1", "s1", 0.0, 3, 128), ("s1:2", "s1", 2.5, 4, 130), ("s2:1", "s2", 0.0, 3, 128)]
    assert np.array_equal(a.token_ids, b.token_ids[:128])
    assert not np.array_equal(a.token_ids[:64], c.token_ids[:64])  # id 0 of s2 is not id 0 of s1
    rows[1]["hash_id_scope"] = rows[0]["hash_id_scope"] = "global"
    a, b, c = read_trace(write_jsonl(tmp_path / "g.jsonl", rows))
    assert np.array_equal(a.token_ids, c.token_ids)
    # a global row beside local sessions: its ids are shared with global rows only, never a session's own
    mixed = [dict(rows[0], hash_id_scope="local", requests=[{"t": 0.0, "in": 128, "hash_ids": [7, 8]}]),
             dict(rows[1], id="g", hash_id_scope="global"),
             dict(rows[1], id="s3", hash_id_scope="local", requests=[{"t": 1.0, "in": 128, "hash_ids": [7, 8]}]),
             dict(rows[1], id="g2", hash_id_scope="global")]
    s1, g, s3, g2 = read_trace(write_jsonl(tmp_path / "m.jsonl", mixed))
    assert [list(r.blocks.keys) for r in (s1, g, s3, g2)] == [[0, 1], [2, 3], [4, 5], [2, 3]]
    rows[1]["requests"][0]["hash_ids"] = [0]
    with pytest.raises(BadInputError) as info:
        list(read_trace(write_jsonl(tmp_path / "bad.jsonl", rows)))
    assert str(info.value) == (f"{tmp_path / 'bad.jsonl'}:2: requests[0]: 1 hash_ids for input_length 128 at 64 "
                               "tokens per id: expected ceil(128/64) = 2")
    assert [o.prompt_tokens for o in outline_trace(path)] == [128, 130, 128]
    skip = TraceFormat(skip_bad_records=True)
    assert [r.id for r in read_trace(tmp_path / "bad.jsonl", skip)] == ["s1:1", "s1:2"]
    assert trace_note(tmp_path / "bad.jsonl", skip).endswith("; 1 records failed their checks and were skipped "
                                                             "(--skip-bad-records), the first: "
                                                             f"{str(info.value)}")


@settings(max_examples=60, deadline=None)
@given(block=st.sampled_from([1, 3, 16, 64]), a=st.lists(st.integers(0, 4), max_size=6),
       b=st.lists(st.integers(0, 4), max_size=6))
def test_equal_ids_give_equal_blocks_and_distinct_ids_distinct_blocks(tmp_path_factory, block, a, b):
    path = write_jsonl(tmp_path_factory.mktemp("h") / "t.jsonl",
                       [{"block_size": block, "input_length": len(ids) * block, "hash_ids": ids} for ids in (a, b)])
    ra, rb = read_trace(path)
    for i in range(min(len(a), len(b))):
        same = np.array_equal(ra.token_ids[i * block:(i + 1) * block], rb.token_ids[i * block:(i + 1) * block])
        assert same == (a[i] == b[i])


@settings(max_examples=30, deadline=None)
@given(keys=st.lists(st.integers(0, 2**40), min_size=1, max_size=6), block=st.integers(1, 40),
       cut=st.integers(0, 39), piece=st.integers(1, 50))
def test_token_synthesis_in_pieces_is_the_whole_at_once(keys, block, cut, piece):
    """block_token_ids made PIECE_TOKENS at a time equals its definition applied to every token at once."""
    from kvcli.traces import synth

    arr = np.array(keys, dtype=np.uint64)
    length = max(0, len(keys) * block - min(cut, block - 1))
    i = np.arange(length, dtype=np.uint64)
    whole = synth.synth_tokens_(arr[i // np.uint64(block)] * np.uint64(block) + i % np.uint64(block))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(synth, "PIECE_TOKENS", piece)
        assert np.array_equal(synth.block_token_ids(arr, block, length), whole)
