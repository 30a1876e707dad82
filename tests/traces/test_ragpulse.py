"""RAGPulse traces (kvcli/traces/ragpulse.py): detection, the prompt made of each record's components with the
tokens of its component files, segments, the tail tokens input_length counts beyond the ids, string timestamps, the
sample cut of the real trace, and bad input as one line naming the file and line."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.traces.detect import detect_format, outline_trace, read_trace, trace_note
from kvcli.traces.hashids import TraceFormat
from kvcli.traces.paths import expand_paths
from kvcli.traces.ragpulse import COMPONENT_FILES, MAX_PROMPT_TOKENS, parse_seconds
from kvcli.traces.request import Segment
from kvcli.traces.synth import block_token_ids

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "ragpulse_head60"
# a small corpus: id -> tokens, in the component file of its kind
SYS, PASSAGES, HISTORY, QUESTIONS = {1: 8, 2: 3}, {10: 5, 11: 7, 12: 2}, {20: 4}, {30: 1, 31: 2}


def write_components(folder: Path, web: dict[int, int] | None = None) -> None:
    """The five component files (web_search empty unless ``web``), in RAGPulse's line shape."""
    tables = {"1_sys_prompt.jsonl": SYS, "2_passages.jsonl": PASSAGES, "3_history.jsonl": HISTORY,
              "4_user_input.jsonl": QUESTIONS, "5_web_search.jsonl": web or {}}
    for name, key in COMPONENT_FILES:
        (folder / name).write_text("".join(json.dumps({key: i, "token_length": n}) + "\n"
                                           for i, n in tables[name].items()))


def record(sys, passages, history, question, input_length, timestamp="0", **more) -> dict:
    return {"timestamp": timestamp, "input_length": input_length, "output_length": 5,
            "hash_ids": {"sys_prompt": sys, "passages_ids": passages, "history": history, "web_search": [],
                         "user_input": question}, "session_id": "s", **more}


def write_trace(folder: Path, rows: list[dict], name: str = "0_trace.jsonl") -> Path:
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def id_tokens(hash_id: int, n: int) -> np.ndarray:
    """The tokens of one id: the first n tokens of its block at the reader's 2**20-token stride (synth.py)."""
    return block_token_ids(np.array([hash_id], np.uint64), 1 << 20, n)


def test_a_record_reads_as_its_components_in_order_with_its_own_tail(tmp_path):
    """sys [1, 2] = 8 + 3, passages [11, 10] = 7 + 5, history [20] = 4, question [30] = 1: 28 tokens of ids, and
    input_length 31 adds 3 tokens of the request's own at the end."""
    write_components(tmp_path)
    path = write_trace(tmp_path, [record([1, 2], [11, 10], [20], [30], 31, timestamp="82")])
    assert detect_format(path) == "ragpulse"
    (r,) = read_trace(path)
    assert (r.prompt_tokens, r.timestamp, r.session_id, r.output_length, r.id) == (31, 82.0, "s", 5,
                                                                                   "0_trace.jsonl:1")
    assert r.segments == (Segment(0, 8, "sys_prompt", "1"), Segment(8, 11, "sys_prompt", "2"),
                          Segment(11, 18, "passages_ids", "11"), Segment(18, 23, "passages_ids", "10"),
                          Segment(23, 27, "history", "20"), Segment(27, 28, "user_input", "30"))
    expected = np.concatenate([id_tokens(1, 8), id_tokens(2, 3), id_tokens(11, 7), id_tokens(10, 5),
                               id_tokens(20, 4), id_tokens(30, 1)])
    assert np.array_equal(r.token_ids[:28], expected)
    assert r.token_ids.dtype == np.dtype("<u4") and len(r.token_ids) == 31
    assert list(outline_trace(path)) == [(31, 82.0, "")]


def test_an_id_gives_the_same_tokens_at_any_position_and_tails_are_never_shared(tmp_path):
    write_components(tmp_path)
    path = write_trace(tmp_path, [record([1], [10, 11], [], [30], 21), record([2], [11, 10], [], [30], 16)])
    a, b = read_trace(path)
    # passage 10 is tokens 8..13 of a (after sys 1's 8) and 10..15 of b (after sys 2's 3 and passage 11's 7)
    assert np.array_equal(a.token_ids[8:13], b.token_ids[10:15])
    assert np.array_equal(a.token_ids[13:20], b.token_ids[3:10])  # passage 11
    a2, b2 = read_trace(write_trace(tmp_path, [record([1], [], [], [30], 12), record([1], [], [], [30], 12)],
                                    "tails.jsonl"))
    # 9 tokens of ids, 3 of each request's own: equal up to the tail, then not
    assert np.array_equal(a2.token_ids[:9], b2.token_ids[:9]) and not np.array_equal(a2.token_ids[9:],
                                                                                     b2.token_ids[9:])


def test_a_record_whose_ids_exceed_input_length_is_refused_and_the_note_says_what_was_read(tmp_path):
    write_components(tmp_path)
    # 8 + 3 + 2 = 13 and 8 tokens of ids, no more: the note has no tail to tell; 2 and 9 more: it has
    path = write_trace(tmp_path, [record([1, 2], [], [], [31], 13), record([1], [], [], [], 8)])
    head = (f"read as a RAGPulse trace: tokens per hash id from the component files in {tmp_path}; each prompt is "
            "its components in the record's order, one segment per id (as RAGPulse's replay concatenates them: "
            "sys_prompt, passages_ids, history, web_search, user_input)")
    tail = "timestamps in s (the format's), sessions: session_id when present"
    assert trace_note(path) == f"{head}; {tail}"
    path = write_trace(tmp_path, [record([1, 2], [], [], [31], 15), record([1], [], [], [], 17)], "tails.jsonl")
    assert trace_note(path, TraceFormat(block_tokens=16)) == (
        f"{head}; input_length counts 2 to 9 tokens more than the ids' (11 in all): each request's own last tokens, "
        f"never shared; {tail}; --hash-block-tokens applies to fixed-block hash-id traces only: this ragpulse trace "
        "is read without it")
    bad = write_trace(tmp_path, [record([1, 2], [], [], [31], 12)], "short.jsonl")
    with pytest.raises(BadInputError) as info:
        list(read_trace(bad))
    assert str(info.value) == (f"{bad}:1: input_length 12 is less than the 13 tokens of its hash_ids (the component "
                               "files' token_length of each id)")


@pytest.mark.parametrize("row, message", [
    (record([1], [99], [], [], 20), "hash_ids.passages_ids[0] = 99 is in no component file beside the trace "
                                    "({folder}: 1_sys_prompt.jsonl, 2_passages.jsonl, 3_history.jsonl, "
                                    "4_user_input.jsonl, 5_web_search.jsonl)"),
    (record([1], ["10"], [], [], 20), "hash_ids.passages_ids[0] = '10' is not an integer in [0, 2**64)"),
    ({**record([1], [], [], [], 20), "hash_ids": {"sys_prompt": 1}}, "hash_ids.sys_prompt must be a list of ids, "
                                                                     "not a number"),
    (record([1], [], [], [], 20, timestamp="soon"), "timestamp must be a finite number >= 0 (or a string of one), "
                                                    "got 'soon'"),
    (record([1], [], [], [], 20, timestamp="-1"), "timestamp must be a finite number >= 0 (or a string of one), "
                                                  "got '-1'"),
    (record([1], [], [], [], 20, timestamp="nan"), "timestamp must be a finite number >= 0 (or a string of one), "
                                                   "got 'nan'"),
    # Python's float() takes these; none is a number as JSON writes one
    (record([1], [], [], [], 20, timestamp="1_000"), "timestamp must be a finite number >= 0 (or a string of one), "
                                                     "got '1_000'"),
    (record([1], [], [], [], 20, timestamp=" 93 "), "timestamp must be a finite number >= 0 (or a string of one), "
                                                    "got ' 93 '"),
    (record([1], [], [], [], 20, timestamp="\u0668\u0662"), "timestamp must be a finite number >= 0 (or a string of "
                                                            "one), got '\u0668\u0662'"),
    # valid JSON, but no float holds it; the message quotes its first 37 characters
    (record([1], [], [], [], 20, timestamp=10**400), "timestamp must be a finite number >= 0 (or a string of one), "
                                                     "got 1" + "0" * 36 + "..."),
    (record([1], [], [], [], MAX_PROMPT_TOKENS + 1), f"input_length {MAX_PROMPT_TOKENS + 1:,} is above "
                                                     f"{MAX_PROMPT_TOKENS:,} tokens, the longest prompt kvcli reads "
                                                     "from a ragpulse record (its token ids are made as it is read)"),
    ({"hash_ids": {"sys_prompt": [1]}}, "a ragpulse record needs input_length (an integer >= 0)"),
])
def test_a_bad_record_is_one_line_naming_the_file_and_line(tmp_path, row, message):
    write_components(tmp_path)
    path = write_trace(tmp_path, [record([1], [], [], [], 8), row])
    message = message.replace("{folder}", str(tmp_path))
    with pytest.raises(BadInputError) as info:
        list(read_trace(path))
    assert str(info.value) == f"{path}:2: {message}"
    out = CliRunner().invoke(app, ["stats", str(path)])
    assert out.exit_code == 2
    assert out.stderr == f"kvcli: error: {path}:2: {message}\n"
    skipped = list(read_trace(path, TraceFormat("ragpulse", skip_bad_records=True)))
    assert len(skipped) == 1  # --skip-bad-records: the bad line skipped, and the note counts it
    assert "1 records failed their checks and were skipped" in trace_note(path, TraceFormat(skip_bad_records=True))


@pytest.mark.parametrize("name, line, message", [
    ("2_passages.jsonl", '{"passage_id": 10, "token_length": 0}',
     "token_length must be an integer in [1, 1,048,576], got 0"),
    ("2_passages.jsonl", '{"passage_id": -1, "token_length": 3}',
     "passage_id must be an integer in [0, 2**64), got -1"),
    ("2_passages.jsonl", '{"history_id": 10, "token_length": 3}',
     'a component line is {"passage_id": id, "token_length": tokens}, got the keys history_id, token_length'),
    ("3_history.jsonl", '{"history_id": 11, "token_length": 3}',
     "id 11 has token_length 3 here but 7 at {folder}/2_passages.jsonl:2"),
])
def test_a_bad_component_line_names_its_own_file_and_line(tmp_path, name, line, message):
    write_components(tmp_path)
    with open(tmp_path / name, "a") as f:
        f.write(line + "\n")
    where = len((tmp_path / name).read_text().splitlines())
    path = write_trace(tmp_path, [record([1], [], [], [], 8)])
    with pytest.raises(BadInputError) as info:
        list(read_trace(path))
    assert str(info.value) == f"{tmp_path / name}:{where}: " + message.replace("{folder}", str(tmp_path))


def test_a_missing_component_file_is_named_when_an_id_needs_it(tmp_path):
    write_components(tmp_path)
    (tmp_path / "2_passages.jsonl").unlink()
    path = write_trace(tmp_path, [record([1], [], [], [30], 9), record([1], [10], [], [], 20)])
    rows = read_trace(path)
    assert next(rows).prompt_tokens == 9  # needs no passage
    with pytest.raises(BadInputError, match=r"0_trace\.jsonl:2: hash_ids\.passages_ids\[0\] = 10 is in no component "
                                            r"file .*; not found here: 2_passages\.jsonl\)$"):
        next(rows)


def test_detection_takes_an_object_of_hash_ids_for_ragpulse_and_refuses_a_component_file(tmp_path):
    write_components(tmp_path)
    # Bailian's fields beside an object of hash_ids: only the ragpulse reader can read it
    path = write_trace(tmp_path, [{**record([1], [], [], [], 8), "chat_id": 3}])
    assert detect_format(path) == "ragpulse"
    with pytest.raises(BadInputError) as info:
        detect_format(tmp_path / "2_passages.jsonl")
    assert str(info.value) == (f"{tmp_path / '2_passages.jsonl'}:1: a RAGPulse component file (its keys: passage_id, "
                               "token_length), not a trace: it gives the tokens of each hash id to the trace beside "
                               "it; name the trace (RAGPulse's 0_trace.jsonl)")
    # a folder of RAGPulse's layout contributes its trace, not its component files
    assert expand_paths([tmp_path]) == [path]


def test_the_sample_is_a_cut_of_the_real_trace():
    """60 requests of the published trace; every prompt is input_length tokens (183,037 in all), 6 to 12 of them
    beyond the ids' (SOURCES.md); timestamps are the strings' seconds; the segments' kinds are RAGPulse's five."""
    path = SAMPLE / "0_trace.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    requests = list(read_trace(path))
    assert len(requests) == 60 and detect_format(path) == "ragpulse"
    assert [r.prompt_tokens for r in requests] == [row["input_length"] for row in rows]
    assert sum(r.prompt_tokens for r in requests) == 183_037
    assert [r.timestamp for r in requests] == [float(row["timestamp"]) for row in rows]
    assert {s.kind for r in requests for s in r.segments} == {"sys_prompt", "passages_ids", "history", "web_search",
                                                              "user_input"}
    tails = [r.prompt_tokens - r.segments[-1].end for r in requests]
    assert (min(tails), max(tails), sum(tails)) == (6, 12, 563)


@settings(max_examples=200, deadline=None)
@given(seconds=st.floats(min_value=0, max_value=253_402_300_799.999))
def test_a_timestamp_string_reads_as_the_number_it_writes(seconds):
    """Any number >= 0 up to the end of the year 9999 (253402300799.999999 s), written as Python (and JSON) write it
    ("82", "1.5e-07", "253402300000.0"), reads back as itself, in seconds."""
    assert parse_seconds(repr(seconds), 1) == seconds
    assert parse_seconds(seconds, 1000) == seconds / 1000


ids = st.sampled_from([*SYS, *PASSAGES, *HISTORY, *QUESTIONS])
LENGTHS = {**SYS, **PASSAGES, **HISTORY, **QUESTIONS}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.dictionaries(st.sampled_from(["sys_prompt", "passages_ids", "history", "extra"]),
                                               st.lists(ids, max_size=4), max_size=4),
                               st.integers(0, 5), st.integers(0, 10**6)), min_size=1, max_size=6))
def test_any_well_formed_trace_reads_as_its_ids_in_order(tmp_path, rows):
    """Whatever components (any names, in any order) and ids: the prompt is input_length tokens; the segments are
    the ids in record order, back to back from token 0; two segments have equal tokens exactly when their ids are
    equal; the outline gives the same lengths and times."""
    write_components(tmp_path)
    records = [{"timestamp": str(t), "input_length": sum(LENGTHS[i] for v in comps.values() for i in v) + tail,
                "hash_ids": comps} for comps, tail, t in rows]
    path = write_trace(tmp_path, records)
    got = list(read_trace(path))
    assert [(r.prompt_tokens, r.timestamp, r.model) for r in got] == [tuple(o) for o in outline_trace(path)]
    pieces = []
    for r, rec in zip(got, records):
        listed = [(kind, i) for kind, v in rec["hash_ids"].items() for i in v]
        assert [(s.kind, int(s.key)) for s in r.segments] == listed
        assert r.prompt_tokens == rec["input_length"]
        at = 0
        for s in r.segments:
            assert (s.start, s.end - s.start) == (at, LENGTHS[int(s.key)])
            at = s.end
            pieces.append((s.key, r.token_ids[s.start:s.end].tobytes()))
    for key_a, a in pieces:
        for key_b, b in pieces:
            assert (a == b) == (key_a == key_b)
