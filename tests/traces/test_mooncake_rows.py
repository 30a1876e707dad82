"""Mooncake rows as aiperf and Dynamo write them (kvcli/traces/mooncake.py): session_id, delay, messages, tools,
text_input, payload, extra, context_mode, aiperf's agentic-code delta sessions, Parquet. Every expected value is
computed by hand (the comment beside it says how) or is another reader's output for the same request."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.traces.detect import detect_format, outline_trace, read_trace, trace_note
from kvcli.traces.hashids import TraceFormat
from kvcli.traces.request import ChatPrompt
from kvcli.traces.synth import block_token_ids

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_parquet(path, records):
    """The records as a Parquet table: one column per key of any record, null where a record has no such field."""
    keys = list(dict.fromkeys(k for r in records for k in r))
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in records]), path)
    return path


def bad(path, fmt="auto") -> str:
    with pytest.raises(BadInputError) as info:
        list(read_trace(path, fmt))
    return str(info.value)


MESSAGES = [{"role": "system", "content": "You are a support agent."}, {"role": "user", "content": "My order?"}]
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Find an order",
                                           "parameters": {"type": "object",
                                                          "properties": {"order": {"type": "string"}}}}}]


# ---------------------------------------------------------------------------------------------- time and sessions

def test_delay_rows_arrive_their_delay_after_the_previous_turn_of_their_session(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"session_id": "a", "timestamp": 1000, "input_length": 10, "hash_ids": [1]},
        {"session_id": "b", "timestamp": 1200, "input_length": 10, "hash_ids": [2]},
        {"session_id": "a", "delay": 500, "input_length": 20, "hash_ids": [1]},
        {"session_id": "a", "delay": 250.5, "input_length": 30, "hash_ids": [1]},
        {"session_id": "c", "delay": 100, "input_length": 5, "hash_ids": [3]},       # no previous turn: no time
        {"session_id": "b", "timestamp": 3000, "delay": 10, "input_length": 5, "hash_ids": [2]},  # timestamp wins
        {"delay": 100, "input_length": 5, "hash_ids": [4]},                           # no session: no previous turn
    ])
    requests = list(read_trace(path))
    # a: 1000 ms = 1.0 s, then 1.0 + 0.5, then 1.5 + 0.2505; b: 1.2 s, then its own timestamp 3.0 s
    assert [r.timestamp for r in requests] == [1.0, 1.2, 1.5, 1.7505, None, 3.0, None]
    assert [r.session_id for r in requests] == ["a", "b", "a", "a", "c", "b", None]
    assert [o.timestamp for o in outline_trace(path)] == [r.timestamp for r in requests]
    declared = list(read_trace(path, TraceFormat("mooncake", timestamp_unit="s")))  # delay in the same unit
    assert [r.timestamp for r in declared][:4] == [1000.0, 1200.0, 1500.0, 1750.5]


def test_dynamo_whole_rows_repeat_their_session_s_blocks_as_a_prefix(tmp_path):
    # Dynamo's exporters: a session's first row has timestamp, later rows delay; each row's hash_ids the whole prompt
    path = write_jsonl(tmp_path / "dyn.jsonl", [
        {"session_id": "s", "input_length": 700, "output_length": 9, "hash_ids": [1, 2], "timestamp": 0},
        {"session_id": "s", "input_length": 1100, "output_length": 8, "hash_ids": [1, 2, 3], "delay": 1500.0},
    ])
    first, second = read_trace(path)
    assert (len(first.token_ids), len(second.token_ids)) == (700, 1100)
    assert np.array_equal(second.token_ids[:512], first.token_ids[:512])  # block 1 shared whole
    assert second.timestamp == 1.5 and second.session_id == "s" and second.output_length == 8
    assert second.blocks is not None  # a whole row stays block keys (no token ids made to hash it)


def test_input_length_without_hash_ids_is_a_prompt_of_its_own(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"input_length": 600, "timestamp": 0},
                                              {"input_length": 600, "timestamp": 1},
                                              {"input_length": 10, "hash_ids": [0]}])
    a, b, c = read_trace(path)
    assert (len(a.token_ids), len(b.token_ids), len(c.token_ids)) == (600, 600, 10)
    # synthesized tokens are ~uniform over 100,256 ids: two private blocks agree on almost no position
    assert np.mean(a.token_ids != b.token_ids) > 0.99
    assert not np.array_equal(a.token_ids[:10], c.token_ids)


# ---------------------------------------------------------------------------------------------- text rows

def test_messages_rows_are_the_native_record_s_tokens(tmp_path):
    rows = [{"session_id": "x", "messages": MESSAGES, "tools": TOOLS, "output_length": 12, "delay": 40},
            {"session_id": "x", "messages": MESSAGES[:1], "output_length": 3, "hash_ids": [5], "input_length": 3}]
    path = write_jsonl(tmp_path / "m.jsonl", rows)
    assert detect_format(path) == "mooncake"
    native = write_jsonl(tmp_path / "n.jsonl", [{"messages": MESSAGES, "tools": TOOLS}, {"messages": MESSAGES[:1]}])
    got, want = list(read_trace(path)), list(read_trace(native))
    assert [r.token_ids.tolist() for r in got] == [r.token_ids.tolist() for r in want]
    assert got[0].chat == ChatPrompt(MESSAGES, TOOLS) and got[0].session_id == "x" and got[0].output_length == 12
    assert got[0].timestamp is None  # a delay with no previous turn
    assert [o.prompt_tokens for o in outline_trace(path)] == [len(r.token_ids) for r in want]


def test_text_input_is_one_user_message_and_payload_the_request_body(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [
        {"text_input": "What is the capital of France?", "output_length": 20},
        {"payload": {"messages": MESSAGES, "max_tokens": 50}, "timestamp": 1000},
        {"payload": {"prompt": "Once upon a time"}, "extra": {"cache_salt": "acme", "temperature": 0}},
    ])
    native = write_jsonl(tmp_path / "n.jsonl", [
        {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
        {"messages": MESSAGES}, {"prompt": "Once upon a time"}])
    got, want = list(read_trace(path)), list(read_trace(native))
    assert [r.token_ids.tolist() for r in got] == [r.token_ids.tolist() for r in want]
    assert [r.cache_salt for r in got] == ["", "", "acme"]
    assert got[1].timestamp == 1.0


def test_the_note_of_a_trace_whose_first_row_is_text_says_it_has_no_hash_ids(tmp_path):
    """A first row of messages (the customer-service sample) or text_input has no hash ids: the note says so before
    the rules for rows of hash_ids, which a later row may still be."""
    rules = ("512 tokens per hash id (the format's), timestamps in ms (the format's), sessions: session_id when "
             "present")
    note = trace_note(SAMPLES / "customer_service_handmade.parquet")
    assert note.startswith("its first row's prompt is text (messages), tokenized as the request it makes, without "
                           f"hash ids; rows of hash_ids: read as a mooncake hash-id trace: {rules}")
    path = write_jsonl(tmp_path / "t.jsonl", [{"text_input": "hi"}, {"input_length": 4, "hash_ids": [1]}])
    assert trace_note(path).startswith("its first row's prompt is text (text_input), tokenized as the request it "
                                       f"makes, without hash ids; rows of hash_ids: read as a mooncake hash-id "
                                       f"trace: {rules}")


def test_extra_cache_salt_is_the_tenant_of_a_block_row_and_may_not_contradict_the_row_s(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"input_length": 4, "hash_ids": [1], "extra": {"cache_salt": "t1"}},
                                              {"input_length": 4, "hash_ids": [1], "cache_salt": "t1"}])
    assert [r.cache_salt for r in read_trace(path)] == ["t1", "t1"]
    clash = write_jsonl(tmp_path / "c.jsonl", [{"input_length": 4, "hash_ids": [1], "cache_salt": "a",
                                                "extra": {"cache_salt": "b"}}])
    assert bad(clash) == f"{clash}:1: cache_salt 'a' and extra.cache_salt 'b' differ: a request has one tenant salt"


# ---------------------------------------------------------------------------------------------- delta sessions

def _agentic(group: bool = True, mode: str | None = None) -> list[dict]:
    """aiperf's agentic-code rows (writer.py): turn 0 with timestamp and group_id, later turns delay and new ids."""
    first = {"session_id": "s1", "input_length": 600, "output_length": 10, "hash_ids": [0, 1], "timestamp": 0.0}
    if group:
        first["group_id"] = 4
    rows = [first, {"session_id": "s1", "input_length": 100, "output_length": 20, "hash_ids": [1000], "delay": 2450.3},
            {"session_id": "s1", "input_length": 50, "output_length": 7, "hash_ids": [1001], "delay": 100.0},
            {"session_id": "s2", "input_length": 520, "output_length": 5, "hash_ids": [0, 2], "timestamp": 10.0,
             **({"group_id": 5} if group else {})}]
    if mode is not None:
        for row in rows:
            row["context_mode"] = mode
    return rows


def test_agentic_code_sessions_accumulate_deltas_and_responses(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", _agentic())
    t0, t1, t2, other = read_trace(path)
    # turn 1: 600 + turn 0's 10 response tokens + 100 new = 710; turn 2: 710 + 20 + 50 = 780
    assert [len(r.token_ids) for r in (t0, t1, t2, other)] == [600, 710, 780, 520]
    assert [o.prompt_tokens for o in outline_trace(path)] == [600, 710, 780, 520]
    assert np.array_equal(t1.token_ids[:600], t0.token_ids) and np.array_equal(t2.token_ids[:710], t1.token_ids)
    assert np.array_equal(t1.token_ids[610:], block_token_ids(np.array([1000], np.uint64), 512, 100))
    assert np.array_equal(t0.token_ids[:512], other.token_ids[:512])  # the shared first block (id 0)
    response = t1.token_ids[600:610]
    assert not np.array_equal(response, block_token_ids(np.array([1000], np.uint64), 512, 10))
    # 0 ms; + 2450.3 ms; + 100 ms; session 2 at 10 ms
    assert [r.timestamp for r in (t0, t1, t2, other)] == pytest.approx([0.0, 2.4503, 2.5503, 0.01])
    assert not t2.token_ids.flags.writeable


def test_context_mode_declares_delta_rows_with_or_without_responses(tmp_path):
    live = list(read_trace(write_jsonl(tmp_path / "l.jsonl", _agentic(False, "deltas_without_responses"))))
    assert [len(r.token_ids) for r in live] == [600, 710, 780, 520]
    canned = list(read_trace(write_jsonl(tmp_path / "c.jsonl", _agentic(False, "deltas_with_responses"))))
    assert [len(r.token_ids) for r in canned] == [600, 700, 750, 520]  # 600 + 100, then + 50: no response tokens
    whole = list(read_trace(write_jsonl(tmp_path / "w.jsonl", _agentic(False))))
    assert [len(r.token_ids) for r in whole] == [600, 100, 50, 520]  # whole rows: each its own input_length


@pytest.mark.parametrize("rows, words", [
    ([{"input_length": 1, "hash_ids": [0], "context_mode": "deltas"}],
     "1: context_mode must be one of message_array_with_responses, deltas_without_responses, deltas_with_responses, "
     "got 'deltas'"),
    ([{"session_id": "s", "input_length": 1, "hash_ids": [0], "group_id": 1},
      {"session_id": "s", "input_length": 1, "hash_ids": [1], "context_mode": "message_array_with_responses"}],
     "2: context_mode message_array_with_responses is not its session's (session 's': deltas_without_responses, "
     "from its first row)"),
    ([{"session_id": "s", "input_length": 1, "hash_ids": [0], "group_id": 1},
      {"session_id": "s", "messages": [{"role": "user", "content": "hi"}]}],
     "2: a messages row is a whole prompt, but session 's' holds delta rows (deltas_without_responses): a delta "
     "session holds input_length rows only"),
    ([{"input_length": 1, "hash_ids": [0], "tools": []}], "1: tools go with messages (a chat request)"),
    ([{"input_length": 1, "hash_ids": [0], "extra": [1]}],
     "1: extra must be an object (fields merged into the request body), not a list"),
    ([{"input_length": 1, "hash_ids": [0], "delay": "soon"}], "1: delay must be a finite number >= 0, got 'soon'"),
    ([{"text_input": 5}], "1: text_input must be a string, not a number"),
    ([{"payload": "POST"}], "1: payload must be a request object, not a string"),
])
def test_bad_rows_are_one_error_naming_file_and_line(tmp_path, rows, words):
    path = write_jsonl(tmp_path / "b.jsonl", rows)
    assert bad(path, "mooncake") == f"{path}:{words}"


def test_a_bad_row_is_exit_2_one_line_no_traceback_and_skipped_on_request(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", [{"session_id": "s", "input_length": 10, "hash_ids": [0], "delay": 0},
                                              {"session_id": "s", "input_length": 10, "hash_ids": [0], "delay": -1},
                                              {"session_id": "s", "input_length": 10, "hash_ids": [0], "delay": 5}])
    out = CliRunner().invoke(app, ["stats", str(path)])
    assert out.exit_code == 2
    assert out.stderr == f"kvcli: error: {path}:2: delay must be a finite number >= 0, got -1\n"
    skipped = CliRunner().invoke(app, ["stats", str(path), "--skip-bad-records", "--json"])
    assert skipped.exit_code == 0, skipped.output
    assert json.loads(skipped.stdout)["traces"][0]["requests"] == 2
    note = trace_note(path, TraceFormat("mooncake", skip_bad_records=True))
    assert note is not None and f"1 records failed their checks and were skipped (--skip-bad-records), the first: " \
                                 f"{path}:2: delay must be" in note


# ---------------------------------------------------------------------------------------------- detection, Parquet

@pytest.mark.parametrize("record, fmt", [
    ({"session_id": "s", "messages": MESSAGES, "tools": TOOLS, "output_length": 3, "delay": 12.5}, "mooncake"),
    ({"messages": MESSAGES, "extra": {"temperature": 0}}, "mooncake"),
    ({"text_input": "hi"}, "mooncake"),
    ({"input_length": 3}, "mooncake"),
    ({"messages": MESSAGES, "hash_ids": [0]}, "mooncake"),
    ({"messages": MESSAGES, "timestamp": 5}, "native"),       # nothing only Mooncake has: kvcli's native record
    ({"prompt": "a", "delay": 5}, None),                      # a native prompt beside a Mooncake field: refused
])
def test_detection_of_mooncake_rows(tmp_path, record, fmt):
    path = write_jsonl(tmp_path / "r.jsonl", [record])
    if fmt is None:
        with pytest.raises(BadInputError, match="fit mooncake and native"):
            detect_format(path)
    else:
        assert detect_format(path) == fmt


def test_mooncake_rows_after_a_first_row_detected_as_native_say_to_pass_the_format(tmp_path):
    """docs/traces.md's aiperf example: its first row (session_id, messages, tools, output_length) is a native
    record, so the file is read as native, and its second row's error names that row's Mooncake fields and the
    format to pass; with --format mooncake it reads (the second row's delay has no timed turn before it: no time)."""
    path = write_jsonl(tmp_path / "aiperf.jsonl", [
        {"session_id": "c1", "messages": MESSAGES, "tools": [], "output_length": 41},
        {"session_id": "c1", "input_length": 1855, "output_length": 1345, "hash_ids": [9283, 9284, 9285, 9286],
         "delay": 12219.3}])
    words = (f"{path}:2: a native record needs exactly one of prompt, messages, token_ids (found: none); its "
             "hash_ids, input_length, delay are a Mooncake row's: the file was read as native records (its first "
             "record has no field only a Mooncake row has); pass --format mooncake")
    assert bad(path) == words
    out = CliRunner().invoke(app, ["stats", str(path)])
    assert (out.exit_code, out.stderr) == (2, f"kvcli: error: {words}\n")
    # named, the format is the user's: the error is the native reader's alone
    assert bad(path, "native") == (f"{path}:2: a native record needs exactly one of prompt, messages, token_ids "
                                   "(found: none)")
    chat, blocks = read_trace(path, "mooncake")
    assert (chat.session_id, blocks.session_id, len(blocks.token_ids), blocks.timestamp) == ("c1", "c1", 1855, None)


def test_parquet_rows_read_as_their_jsonl_and_null_columns_are_absent_fields(tmp_path):
    rows = [{"session_id": "c1", "messages": MESSAGES, "output_length": 158, "tools": None, "delay": None},
            {"session_id": "c1", "messages": MESSAGES[:1], "output_length": 103, "tools": None, "delay": 4503.332},
            {"session_id": "c2", "messages": MESSAGES, "output_length": 5, "tools": TOOLS, "delay": None}]
    parquet = write_parquet(tmp_path / "t.parquet", rows)
    jsonl = write_jsonl(tmp_path / "t.jsonl", [{k: v for k, v in r.items() if v is not None} for r in rows])
    assert detect_format(parquet) == "mooncake"
    got, want = list(read_trace(parquet)), list(read_trace(jsonl))
    assert [(r.token_ids.tolist(), r.session_id, r.output_length, r.timestamp) for r in got] == \
           [(r.token_ids.tolist(), r.session_id, r.output_length, r.timestamp) for r in want]
    assert [r.source for r in got] == [f"{parquet}:{n}" for n in (1, 2, 3)]


def test_a_parquet_file_of_native_records_and_one_of_another_format(tmp_path):
    native = write_parquet(tmp_path / "n.parquet", [{"prompt": "hello", "timestamp": 1.5}])
    assert detect_format(native) == "native"
    assert [r.timestamp for r in read_trace(native)] == [1.5]
    other = write_parquet(tmp_path / "o.parquet", [{"conversations": [{"from": "human", "value": "hi"}]}])
    with pytest.raises(BadInputError) as info:
        detect_format(other)
    assert str(info.value) == (f"{other}:1: a Parquet file's rows are read as mooncake, hash-ids, native records; "
                               "its first row fits sharegpt")


def test_a_bad_parquet_row_names_its_row_and_a_cut_file_is_one_error(tmp_path):
    path = write_parquet(tmp_path / "b.parquet", [{"input_length": 10, "hash_ids": [0]},
                                                  {"input_length": 10, "hash_ids": [0, 1]}])
    assert bad(path) == f"{path}:2: 2 hash_ids for input_length 10 at 512 tokens per id: expected ceil(10/512) = 1"
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(path.read_bytes()[:40])
    out = CliRunner().invoke(app, ["stats", str(cut), "--format", "mooncake"])
    assert out.exit_code == 2
    assert out.stderr.startswith(f"kvcli: error: {cut}:1: cannot read Parquet (") and out.stderr.count("\n") == 1
    assert "Traceback" not in out.output


# ---------------------------------------------------------------------------------------------- Parquet time types

#: 2023-11-14T22:13:20Z and 250 ms, 1 s after it, as integer ms since the Unix epoch
EPOCH_MS = [1_700_000_000_000, 1_700_000_000_250, 1_700_000_001_000]
PER_MS = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}


def time_table(ms: list[int], arrow_type: pa.DataType, per_ms: int | None, **columns) -> pa.Table:
    """Rows of one private block each, whose ``timestamp`` column holds ``ms`` (integer ms since the epoch) as
    ``arrow_type`` (``per_ms`` of its units a ms; None: seconds, each value a whole second)."""
    raw = [m // 1000 if per_ms is None else m * per_ms for m in ms]
    return pa.table({"timestamp": pa.array(raw, pa.int64()).cast(arrow_type), "input_length": [4] * len(ms),
                     "hash_ids": [[i] for i in range(len(ms))], **columns})


@pytest.mark.parametrize("unit", ["ms", "us", "ns"])
@pytest.mark.parametrize("tz", [None, "UTC", "America/New_York"])
def test_a_parquet_timestamp_column_is_read_as_its_instant_in_ms_since_the_epoch(tmp_path, unit, tz):
    typed = tmp_path / "typed.parquet"
    pq.write_table(time_table(EPOCH_MS, pa.timestamp(unit, tz), PER_MS[unit]), typed)
    integer = tmp_path / "integer.parquet"
    pq.write_table(time_table(EPOCH_MS, pa.int64(), 1), integer)
    assert detect_format(typed) == "mooncake"
    # 1,700,000,000,000 ms = 1,700,000,000 s; + 0.25 s; + 1 s (a time zone names the same instants)
    assert [r.timestamp for r in read_trace(typed)] == [1_700_000_000.0, 1_700_000_000.25, 1_700_000_001.0]
    assert [r.timestamp for r in read_trace(typed)] == [r.timestamp for r in read_trace(integer)]
    assert [o.timestamp for o in outline_trace(typed)] == [1_700_000_000.0, 1_700_000_000.25, 1_700_000_001.0]
    # the column's own unit: --timestamp-unit (which would read the integers as seconds) does not apply to it
    assert [r.timestamp for r in read_trace(typed, TraceFormat("mooncake", timestamp_unit="s"))][0] == 1.7e9


def test_nanoseconds_are_cut_to_whole_microseconds_and_a_duration_is_its_length(tmp_path):
    path = tmp_path / "ns.parquet"
    # 1,700,000,000,123,456,789 ns: its whole microseconds are 1,700,000,000,123,456 us
    pq.write_table(pa.table({
        "session_id": ["a", "a", "b"],
        "timestamp": pa.array([1_700_000_000_123_456_789, None, None], pa.int64()).cast(pa.timestamp("ns", "UTC")),
        "delay": pa.array([None, 1_500_000_999, 7], pa.int64()).cast(pa.duration("ns")),
        "input_length": [4, 4, 4], "hash_ids": [[0], [0], [1]]}), path)
    first, second, lone = read_trace(path)
    assert first.timestamp == 1_700_000_000_123_456 / 1_000_000
    # + 1,500,000,999 ns = 1,500,000 us (the 999 ns cut) = 1.5 s; b has no timed previous turn: no time
    assert second.timestamp == (1_700_000_000_123_456 + 1_500_000) / 1_000_000
    assert lone.timestamp is None
    offsets = tmp_path / "offsets.parquet"  # a duration timestamp: time from the trace's start
    pq.write_table(time_table([0, 250, 1000], pa.duration("ms"), 1), offsets)
    assert [r.timestamp for r in read_trace(offsets)] == [0.0, 0.25, 1.0]


def test_a_duration_delay_adds_as_its_integer_ms_do(tmp_path):
    rows = {"session_id": ["s", "s", "s"], "timestamp": pa.array([1000, None, None], pa.int64()),
            "input_length": [4, 4, 4], "hash_ids": [[0], [0], [0]]}
    typed, integer = tmp_path / "d.parquet", tmp_path / "i.parquet"
    pq.write_table(pa.table({**rows, "delay": pa.array([None, 500, 250], pa.int64()).cast(pa.duration("ms"))}),
                   typed)
    pq.write_table(pa.table({**rows, "delay": pa.array([None, 500, 250], pa.int64())}), integer)
    # 1000 ms = 1.0 s, + 0.5 s, + 0.25 s
    assert [r.timestamp for r in read_trace(typed)] == [1.0, 1.5, 1.75]
    assert [r.timestamp for r in read_trace(typed)] == [r.timestamp for r in read_trace(integer)]


@pytest.mark.parametrize("column, values, words", [
    ("timestamp", pa.array([0, -5], pa.int64()).cast(pa.timestamp("ms")),
     "2: timestamp must be at or after the Unix epoch (1970-01-01T00:00:00Z), got 1969-12-31T23:59:59.995000"),
    ("delay", pa.array([None, 5], pa.int64()).cast(pa.timestamp("ms")),
     "2: delay must be a number or a duration, not a timestamp (1970-01-01T00:00:00.005000)"),
    ("delay", pa.array([None, -5], pa.int64()).cast(pa.duration("ms")),  # -5 ms, said in seconds
     "2: delay must be a duration >= 0, got -0.005 s"),
    # 10**12 s is past the year 9999, the last a Python datetime holds (Parquet keeps seconds as ms)
    ("timestamp", pa.array([0, 10**12], pa.int64()).cast(pa.timestamp("s")),
     "2: cannot read column timestamp (timestamp[ms]): a timestamp outside the years 1 to 9999, the range a Python "
     "datetime holds (date value out of range)"),
    # 2**62 ms: past what Python's datetime arithmetic takes at all (pyarrow's words differ; kvcli's are the same)
    ("timestamp", pa.array([0, 2**62], pa.int64()).cast(pa.timestamp("ms")),
     "2: cannot read column timestamp (timestamp[ms]): a timestamp outside the years 1 to 9999, the range a Python "
     "datetime holds (Python int too large to convert to C int)"),
    # 10**9 days in ms: one day more than a timedelta holds
    ("delay", pa.array([None, 86_400_000 * 10**9], pa.int64()).cast(pa.duration("ms")),
     "2: cannot read column delay (duration[ms]): a duration of 1e9 days or more either way, past what a Python "
     "timedelta holds (days=1000000000; must have magnitude <= 999999999)"),
])
def test_a_bad_time_value_is_one_error_naming_its_row(tmp_path, column, values, words):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"session_id": ["s", "s"], column: values, "input_length": [4, 4],
                             "hash_ids": [[0], [0]]}), path)
    assert bad(path) == f"{path}:{words}"
    out = CliRunner().invoke(app, ["stats", str(path)])
    assert (out.exit_code, out.stderr) == (2, f"kvcli: error: {path}:{words}\n")


def test_a_time_past_what_a_float_holds_is_one_error_naming_its_row(tmp_path):
    """An integer of 401 digits is valid JSON but no float; a delay that adds to a time past 1.8e308 s makes none."""
    huge = tmp_path / "huge.jsonl"
    huge.write_text('{"timestamp": 0, "input_length": 4, "hash_ids": [0]}\n'
                    '{"timestamp": 1' + "0" * 400 + ', "input_length": 4, "hash_ids": [0]}\n')
    cut = "1" + "0" * 36 + "..."  # the value in the message: its first 37 characters
    words = f"{huge}:2: timestamp must be a finite number >= 0, got {cut}"
    assert bad(huge) == words
    out = CliRunner().invoke(app, ["stats", str(huge)])
    assert (out.exit_code, out.stderr) == (2, f"kvcli: error: {words}\n")
    native = tmp_path / "native.jsonl"
    native.write_text('{"timestamp": 1' + "0" * 400 + ', "token_ids": [1]}\n')
    assert bad(native) == f"{native}:1: timestamp must be a finite number >= 0, got {cut}"
    far = write_jsonl(tmp_path / "far.jsonl", [{"session_id": "s", "timestamp": 1e308, "input_length": 4,
                                                "hash_ids": [0]}])
    assert bad(far) == (f"{far}:1: timestamp 1e+308 is 1e+305 s since the Unix epoch, a time outside the years 1 to "
                        "9999, the range a Python datetime (and a Parquet timestamp column) holds")


PAST_9999 = "a time outside the years 1 to 9999, the range a Python datetime (and a Parquet timestamp column) holds"


def test_a_number_past_the_year_9999_is_refused_as_a_timestamp_column_s_value_is(tmp_path):
    """The end of the year 9999 is 253402300800 s after the Unix epoch (a Python datetime's range): a numeric time
    at or past it, its unit applied, is one error naming file and row, as the same instant in a timestamp column."""
    rows = [{"session_id": "s", "timestamp": 253_402_300_799_999, "input_length": 4, "hash_ids": [0]},  # ms
            {"session_id": "t", "timestamp": 2**62, "input_length": 4, "hash_ids": [0]}]
    jsonl, numbers = write_jsonl(tmp_path / "n.jsonl", rows), write_parquet(tmp_path / "n.parquet", rows)
    typed = tmp_path / "t.parquet"
    pq.write_table(pa.table({"session_id": ["s", "t"], "timestamp": pa.array([253_402_300_799_999, 2**62],
                                                                             pa.int64()).cast(pa.timestamp("ms")),
                             "input_length": [4, 4], "hash_ids": [[0], [0]]}), typed)
    # 2**62 ms = 4611686018427387.904 s
    for path in (jsonl, numbers):
        words = f"{path}:2: timestamp 4611686018427387904 is 4.61168601843e+15 s since the Unix epoch, {PAST_9999}"
        assert bad(path) == words
        out = CliRunner().invoke(app, ["stats", str(path)])
        assert (out.exit_code, out.stderr) == (2, f"kvcli: error: {words}\n")
    assert bad(typed).startswith(f"{typed}:2: cannot read column timestamp (timestamp[ms]): a timestamp outside "
                                 "the years 1 to 9999")
    # its last millisecond: 253402300799999 ms = 253402300799.999 s, read alike from a number and from the column
    last = write_jsonl(tmp_path / "last.jsonl", rows[:1])
    assert [r.timestamp for r in read_trace(last)] == [253_402_300_799.999]
    typed_last = tmp_path / "tl.parquet"
    pq.write_table(pq.read_table(typed).slice(0, 1), typed_last)
    assert [r.timestamp for r in read_trace(typed_last)] == [253_402_300_799.999]
    # the first millisecond past it; and seconds (--timestamp-unit s): 1e308 s
    past = write_jsonl(tmp_path / "past.jsonl", [{"timestamp": 253_402_300_800_000, "input_length": 4,
                                                  "hash_ids": [0]}])
    assert bad(past) == f"{past}:1: timestamp 253402300800000 is 253402300800 s since the Unix epoch, {PAST_9999}"
    huge = write_jsonl(tmp_path / "huge.jsonl", [{"timestamp": 1e308, "input_length": 4, "hash_ids": [0]}])
    assert bad(huge, TraceFormat("mooncake", timestamp_unit="s")) == (
        f"{huge}:1: timestamp 1e+308 is 1e+308 s since the Unix epoch, {PAST_9999}")
    # a native record's timestamp is in seconds
    native = write_jsonl(tmp_path / "native.jsonl", [{"timestamp": 253_402_300_799.5, "token_ids": [1]},
                                                     {"timestamp": 253_402_300_800, "token_ids": [1]}])
    assert bad(native) == f"{native}:2: timestamp 253402300800 is 253402300800 s since the Unix epoch, {PAST_9999}"


def test_the_note_says_a_typed_timestamp_column_gives_its_own_unit(tmp_path):
    rows = {"session_id": ["s", "s"], "input_length": [4, 4], "hash_ids": [[0], [0]]}
    typed, numbers = tmp_path / "t.parquet", tmp_path / "n.parquet"
    pq.write_table(pa.table({**rows, "timestamp": pa.array([0, 5], pa.int64()).cast(pa.timestamp("us", "UTC"))}),
                   typed)
    pq.write_table(pa.table({**rows, "timestamp": pa.array([0, 5], pa.int64())}), numbers)
    rules = "read as a mooncake hash-id trace: 512 tokens per hash id (the format's), "
    assert trace_note(typed).startswith(rules + "timestamps from the column's own time type (timestamp[us, tz=UTC]), "
                                        "sessions: ")
    assert trace_note(typed, TraceFormat("mooncake", timestamp_unit="s")).startswith(
        rules + "timestamps from the column's own time type (timestamp[us, tz=UTC]), not --timestamp-unit (numbers "
        "only), sessions: ")
    assert trace_note(numbers).startswith(rules + "timestamps in ms (the format's), sessions: ")


def test_a_delay_to_a_time_past_the_year_9999_is_one_error_naming_its_row(tmp_path):
    start = {"session_id": "s", "timestamp": 253_402_300_000_000, "input_length": 4, "hash_ids": [0]}  # ms
    within = write_jsonl(tmp_path / "in.jsonl", [start, {"session_id": "s", "delay": 799_999, "input_length": 4,
                                                         "hash_ids": [0]}])
    # 253402300000 s + 799.999 s
    assert [r.timestamp for r in read_trace(within)] == [253_402_300_000.0, 253_402_300_799.999]
    past = write_jsonl(tmp_path / "past.jsonl", [start, {"session_id": "s", "delay": 800_000, "input_length": 4,
                                                         "hash_ids": [0]}])
    assert bad(past) == (f"{past}:2: delay (800 s) after its session's previous turn (253402300000 s) is a time "
                         "past the year 9999, the range a Python datetime (and a Parquet timestamp column) holds")


@SETTINGS
@given(ms=st.lists(st.integers(0, 2**41), min_size=1, max_size=6), unit=st.sampled_from(list(PER_MS)),
       tz=st.sampled_from([None, "UTC", "Asia/Kolkata"]))
def test_any_timestamp_column_replays_in_the_order_and_gaps_of_its_integer_ms(tmp_path, ms, unit, tz):
    """The same instants as an Arrow timestamp (any unit; whole seconds for ``s``) and as integer ms: equal floats,
    so equal arrival order and gaps."""
    if unit == "s":
        ms = [m // 1000 * 1000 for m in ms]
    typed, integer = tmp_path / "t.parquet", tmp_path / "i.parquet"
    pq.write_table(time_table(ms, pa.timestamp(unit, tz), PER_MS[unit]), typed)
    pq.write_table(time_table(ms, pa.int64(), 1), integer)
    assert [r.timestamp for r in read_trace(typed)] == [r.timestamp for r in read_trace(integer)] == \
           [m / 1000 for m in ms]


# ---------------------------------------------------------------------------------------------- token-id payloads

def test_a_payload_prompt_of_token_ids_is_the_prompt_s_token_ids(tmp_path):
    rows = [{"session_id": "s", "payload": {"model": "m", "prompt": [7, 8, 9, 4_294_967_295]}, "timestamp": 1000,
             "output_length": 3},
            {"session_id": "s", "payload": {"prompt": []}, "delay": 500, "extra": {"cache_salt": "t"}},
            {"input_length": 4, "hash_ids": [1]}]
    native = write_jsonl(tmp_path / "n.jsonl", [{"token_ids": [7, 8, 9, 4_294_967_295]}, {"token_ids": []}])
    for path in (write_jsonl(tmp_path / "p.jsonl", rows), write_parquet(tmp_path / "p.parquet", rows)):
        first, second, blocks = read_trace(path)
        assert first.token_ids.tolist() == [7, 8, 9, 4_294_967_295] and first.token_ids.dtype == np.dtype("<u4")
        assert second.token_ids.tolist() == []
        assert [r.token_ids.tolist() for r in (first, second)] == [r.token_ids.tolist() for r in read_trace(native)]
        assert (first.chat, first.blocks, first.model, first.output_length) == (None, None, "m", 3)
        assert (first.timestamp, second.timestamp, second.cache_salt) == (1.0, 1.5, "t")  # 1000 ms, + 500 ms
        assert blocks.blocks is not None
        assert [o.prompt_tokens for o in outline_trace(path)] == [4, 0, 4]
    note = trace_note(write_jsonl(tmp_path / "first.jsonl", rows))
    assert note.startswith("its first row's prompt is token ids (payload.prompt), without hash ids; rows of "
                           "hash_ids: read as a mooncake hash-id trace: ")


@pytest.mark.parametrize("prompt, words", [
    ([1, -2], "payload.prompt[1] = -2 is not an integer in [0, 2**32)"),
    ([1, 2**32], "payload.prompt[1] = 4294967296 is not an integer in [0, 2**32)"),
    ([3, 1.5], "payload.prompt[1] = 1.5 is not an integer in [0, 2**32)"),
    ([0, "a"], "payload.prompt[1] = 'a' is not an integer in [0, 2**32)"),
    (["Hello", "Bye"], "payload.prompt[0] = 'Hello' is not an integer in [0, 2**32)"),  # a batch of prompts
    ([[1, 2]], "payload.prompt[0] = [1, 2] is not an integer in [0, 2**32)"),
    ([5, None], "payload.prompt[1] = None is not an integer in [0, 2**32)"),
])
def test_a_payload_prompt_list_that_is_not_token_ids_is_one_error(tmp_path, prompt, words):
    path = write_jsonl(tmp_path / "b.jsonl", [{"payload": {"prompt": [1]}}, {"payload": {"prompt": prompt}}])
    message = f"{path}:2: {words}: a prompt given as a list is one request's token ids"
    assert bad(path) == message
    out = CliRunner().invoke(app, ["stats", str(path)])
    assert (out.exit_code, out.stderr) == (2, f"kvcli: error: {message}\n")
    tools = write_jsonl(tmp_path / "t.jsonl", [{"payload": {"prompt": [1], "tools": TOOLS}}])
    assert bad(tools) == f"{tools}:1: payload: tools go with messages (a chat request), not with prompt"


# ---------------------------------------------------------------------------------------------- properties

turns = st.lists(st.tuples(st.integers(0, 1200), st.integers(0, 40), st.floats(0, 1e5, allow_nan=False)),
                 min_size=1, max_size=5)


@SETTINGS
@given(sessions=st.lists(turns, min_size=1, max_size=3), live=st.booleans(), parquet=st.booleans())
def test_delta_sessions_grow_by_response_and_delta_and_keep_their_prefix(tmp_path, sessions, live, parquet):
    """Turn k's prompt is turn k-1's, its response (live), then turn k's delta; arrival times add the delays; JSONL
    and Parquet give the same; the outline gives the same lengths without the token ids."""
    rows, expected_lengths, expected_times, next_id = [], [], [], 0
    for s, session in enumerate(sessions):
        length, time, previous_output = 0, 0.0, 0
        for k, (new, output, delay) in enumerate(session):
            ids = list(range(next_id, next_id + -(-new // 512)))
            next_id += len(ids)
            row = {"session_id": f"s{s}", "input_length": new, "output_length": output, "hash_ids": ids,
                   "context_mode": "deltas_without_responses" if live else "deltas_with_responses"}
            if k == 0:
                row["timestamp"] = 1000.0 * s
                time = float(s)
            else:
                row["delay"] = delay
                time += delay / 1000
            length += (previous_output if live and k else 0) + new
            previous_output = output
            rows.append(row)
            expected_lengths.append(length)
            expected_times.append(time)
    path = (write_parquet if parquet else write_jsonl)(tmp_path / ("t.parquet" if parquet else "t.jsonl"), rows)
    requests = list(read_trace(path))
    assert [len(r.token_ids) for r in requests] == expected_lengths
    assert [o.prompt_tokens for o in outline_trace(path)] == expected_lengths
    assert [r.timestamp for r in requests] == pytest.approx(expected_times)
    by_session: dict[str, list] = {}
    for r in requests:
        by_session.setdefault(r.session_id, []).append(r.token_ids)
    for prompts in by_session.values():
        for before, after in zip(prompts, prompts[1:]):
            assert np.array_equal(after[:len(before)], before)


# ---------------------------------------------------------------------------------------------- the samples

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_the_aiperf_agentic_sample_s_prompts_are_its_cumulative_inputs():
    """Each session's turn k reads turn k - 1's prompt + its output + turn k's input_length, as aiperf's generator
    defines the cumulative input (computed here from the rows themselves, not by the reader)."""
    rows = [json.loads(line) for line in (SAMPLES / "aiperf_agentic_code_3x5.jsonl").read_text().splitlines()]
    expected, last = [], {}
    for row in rows:
        before = last.get(row["session_id"])
        length = row["input_length"] + (0 if before is None else before[0] + before[1])
        last[row["session_id"]] = (length, row["output_length"])
        expected.append(length)
    requests = list(read_trace(SAMPLES / "aiperf_agentic_code_3x5.jsonl"))
    assert [len(r.token_ids) for r in requests] == expected
    assert sum(expected) == 804_933 and max(expected) == 74_136
    # the three sessions share aiperf's L1 layer: hash ids 0..62, 63 blocks of 512 tokens
    firsts = [r for r in requests if r.timestamp == 0.0]
    assert len(firsts) == 3 and all(np.array_equal(f.token_ids[:63 * 512], firsts[0].token_ids[:63 * 512])
                                    for f in firsts)
    assert not np.array_equal(firsts[0].token_ids[:64 * 512], firsts[1].token_ids[:64 * 512])


def test_the_customer_service_sample_s_turns_extend_each_other():
    requests = list(read_trace(SAMPLES / "customer_service_handmade.parquet"))
    assert [(r.session_id, r.output_length) for r in requests] == [
        ("cs-7f3a91_01", 41), ("cs-7f3a91_01", 58), ("cs-7f3a91_01", 36), ("cs-b20c4e_02", 22), ("cs-b20c4e_02", 30)]
    assert all(r.timestamp is None for r in requests)  # delays, but no session has a timestamp to count from
    for before, after in ((0, 1), (1, 2), (3, 4)):
        head = requests[before].token_ids
        # the generation prompt ends the earlier prompt; the later one has the assistant's turn there instead
        assert np.array_equal(requests[after].token_ids[:len(head) - 3], head[:-3])
