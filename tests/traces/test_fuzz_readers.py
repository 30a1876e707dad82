"""Property tests (hypothesis) over the trace readers: whatever the bytes, a reader yields valid requests or raises
one BadInputError that names the file and, for a record, its line; nothing else escapes."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcli.errors import BadInputError
from kvcli.traces.detect import FORMATS, outline_trace, read_trace
from kvcli.traces.prompts import read_prompts

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)
token_lists = st.lists(st.integers(-5, 2**33), max_size=40)
native = st.fixed_dictionaries({}, optional={
    "token_ids": st.one_of(token_lists, values), "prompt": st.one_of(st.text(max_size=30), values),
    "messages": st.one_of(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "", 3]),
                                                          "content": st.one_of(st.text(max_size=20), values)}),
                                   max_size=3), values),
    "timestamp": st.one_of(st.floats(allow_nan=True), st.integers(-5, 10**6), values),
    "id": values, "session_id": values, "cache_salt": st.one_of(st.text(max_size=5), values),
    "output_length": st.one_of(st.integers(-3, 10**4), values)})
mooncake = st.fixed_dictionaries({"hash_ids": st.one_of(st.lists(st.integers(-3, 2**60), max_size=5), values)},
                                 optional={"input_length": st.one_of(st.integers(-5, 3000), values),
                                           "timestamp": st.one_of(st.integers(-5, 10**7), values),
                                           "output_length": values})
sharegpt = st.fixed_dictionaries({"conversations": st.one_of(st.lists(st.fixed_dictionaries({
    "from": st.sampled_from(["human", "gpt", "system", "robot", 7]), "value": st.one_of(st.text(max_size=20),
                                                                                      values)}), max_size=4), values)},
    optional={"id": values, "system": values, "tools": values})
records = st.one_of(native, mooncake, sharegpt, values)
raw_lines = st.one_of(records.map(lambda r: json.dumps(r, allow_nan=True).encode()),
                      st.binary(max_size=40).filter(lambda b: b"\n" not in b),
                      st.sampled_from([b"", b"   ", b"\xef\xbb\xbf{}", b"{", b"\xff\xfe", b"TIMESTAMP,ContextTokens",
                                       b"[" * 3000]))
files = st.one_of(st.lists(raw_lines, min_size=1, max_size=6).map(lambda lines: b"\n".join(lines) + b"\n"),
                  st.lists(records, max_size=4).map(lambda r: json.dumps(r, allow_nan=True).encode()))
suffixes = st.sampled_from([".jsonl", ".json", ".traj", ".csv", ".txt", ".jsonl.gz"])


def _check(err: BadInputError, path, data: bytes) -> None:
    """One line naming the file; a line number (JSONL) or record number (JSON list) that exists."""
    text = str(err)
    assert text.startswith(f"{path}"), text
    m = re.match(re.escape(str(path)) + r":(\d+): ", text)
    if m:
        assert 1 <= int(m[1]) <= max(data.count(b"\n"), data.count(b","), 0) + 1, text
    assert "\n" not in text and "Traceback" not in text


@SETTINGS
@given(data=files, suffix=suffixes, fmt=st.sampled_from(["auto", *FORMATS]))
def test_readers_yield_requests_or_one_located_error(tmp_path, data, suffix, fmt):
    path = tmp_path / f"trace{suffix}"
    if suffix.endswith(".gz"):
        import gzip

        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    try:
        for r in read_trace(path, fmt, "cl100k_base"):
            assert r.token_ids.dtype == np.dtype("<u4") and r.token_ids.ndim == 1
            assert r.timestamp is None or (r.timestamp >= 0 and np.isfinite(r.timestamp))
    except BadInputError as err:
        _check(err, path, data)


def _outcome(rows):
    """The rows an iterator yields, then the error that stopped it (its one line), or None."""
    out = []
    try:
        for row in rows:
            out.append(row)
    except BadInputError as err:
        return out, str(err)
    return out, None


@SETTINGS
@given(data=files, suffix=suffixes, fmt=st.sampled_from(["auto", *FORMATS]))
def test_a_trace_outline_is_its_requests_lengths_and_times_with_the_same_error(tmp_path, data, suffix, fmt):
    # the replay's first pass reads outline_trace (a Mooncake file without synthesizing token ids): it must see the
    # same requests and stop at the same bad record, with the same message, as the pass that reads the requests
    path = tmp_path / f"trace{suffix}"
    path.write_bytes(data)
    try:
        full = _outcome((len(r.token_ids), r.timestamp, r.model) for r in read_trace(path, fmt, "cl100k_base"))
    except BadInputError as err:  # the file itself (missing format, ...): outline_trace refuses it alike
        with pytest.raises(BadInputError) as caught:
            outline_trace(path, fmt, "cl100k_base")
        assert str(caught.value) == str(err)
        return
    assert _outcome(tuple(o) for o in outline_trace(path, fmt, "cl100k_base")) == full


def test_a_mooncake_outline_gives_input_lengths_and_seconds(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 1500, "input_length": 700, "hash_ids": [1, 2]}\n'
                    '{"input_length": 0, "hash_ids": []}\n'
                    '{"timestamp": 2000, "input_length": 1025, "hash_ids": [1, 2]}\n')
    rows = outline_trace(path)
    assert next(rows) == (700, 1.5, "") and next(rows) == (0, None, "")
    with pytest.raises(BadInputError, match=r"t\.jsonl:3: 2 hash_ids for input_length 1025 at 512 tokens per id: "
                                             r"expected ceil\(1025/512\) = 3"):
        next(rows)


@SETTINGS
@given(data=files, suffix=suffixes, fmt=st.sampled_from(["auto", "lines", *FORMATS]))
def test_warms_prompt_sources_yield_requests_or_one_located_error(tmp_path, data, suffix, fmt):
    path = tmp_path / f"prompts{suffix}"
    path.write_bytes(data)
    try:
        got = read_prompts([str(path)], fmt)
    except BadInputError as err:
        _check(err, path, data)
    else:
        assert all(r.token_ids.dtype == np.dtype("<u4") for r in got)


@SETTINGS
@given(data=files, fmt=st.sampled_from(["auto", "lines", "native"]))
def test_stdin_prompts_yield_requests_or_one_error_naming_stdin(data, fmt):
    import io

    try:
        read_prompts(["-"], fmt, stdin=io.BytesIO(data))
    except BadInputError as err:
        _check(err, "<stdin>", data)


def test_the_fuzzer_reaches_the_located_errors(tmp_path):
    """The strategies above do produce bad records (a check that the property is not vacuous)."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"token_ids": [1]}\n{"token_ids": [-1]}\n')
    try:
        list(read_trace(path))
    except BadInputError as err:
        assert str(err) == f"{path}:2: token_ids[0] = -1 is not an integer in [0, 2**32)"
    else:
        raise AssertionError("no error")


def test_an_error_is_one_line_even_when_the_input_holds_newlines(tmp_path):
    """Found by the fuzzer: a key holding a newline made the undetectable-format error two lines."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"a\\nb": 1}\n')
    try:
        list(read_trace(path))
    except BadInputError as err:
        assert str(err).startswith(f"{path}:1: cannot detect the trace format from the first record's keys (a\\nb)")
    else:
        raise AssertionError("no error")
