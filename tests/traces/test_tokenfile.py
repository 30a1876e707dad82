"""Token-id files (kvcli/traces/tokenfile.py): ids separated by whitespace and commas, or one JSON array; anything
else refused with its file, line and token."""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcli.errors import BadInputError
from kvcli.traces.tokenfile import parse_token_ids, read_token_file

ids = st.lists(st.integers(0, 2**32 - 1), max_size=40)
separators = st.lists(st.sampled_from([" ", ",", "\t", "\n", "\r\n", ", ", " ,\n"]), min_size=1, max_size=3).map(
    "".join)
padding = st.sampled_from(["", " ", "\n", "\n\n  "])


@given(ids, st.data(), padding, padding)
def test_ids_written_with_any_separators_read_back(values, data, before, after):
    gaps = [data.draw(separators) for _ in range(max(len(values) - 1, 0))]
    text = "".join(str(v) + gap for v, gap in zip(values, gaps + [""]))
    assert parse_token_ids(before + text + after, "t.txt") == values


@given(ids, padding)
def test_one_json_array_reads_back(values, around):
    assert parse_token_ids(around + json.dumps(values) + around, "t.json") == values
    assert parse_token_ids(json.dumps(values, indent=1), "t.json") == values


@given(ids, st.data(), st.sampled_from(["x", "1.5", "-1", "+1", "0x10", "4294967296", "1e3", "[", "]", "{}", '"1"',
                                        "1;2", "9" * 5000, "\u0661"]))
def test_a_bad_token_anywhere_is_named_with_its_line(values, data, bad):
    at = data.draw(st.integers(0, len(values)))
    words = [str(v) for v in values[:at]] + [bad] + [str(v) for v in values[at:]]
    text = "\n".join(words)  # one token a line: the bad one on line at + 1
    with pytest.raises(BadInputError) as err:
        parse_token_ids(text, "t.txt")
    shown = repr(bad[:40]) + ("..." if len(bad) > 40 else "")
    assert str(err.value).startswith(f"t.txt:{at + 1}: {shown} is not a token id"), str(err.value)


@pytest.mark.parametrize("text, values", [
    ("", []), ("[]", []), (" [ ] ", []), ("1,,2", [1, 2]), ("007", [7]), ("[1, 2, 3]\n", [1, 2, 3]),
    ("4294967295", [2**32 - 1]),
])
def test_token_files_by_hand(text, values):
    assert parse_token_ids(text, "t.txt") == values


@pytest.mark.parametrize("text, line, bad", [
    ("1 2 x 4", 1, "'x'"), ("1\n2\n1.5", 3, "'1.5'"), ("[1, 2", 1, "'[1'"), ("[1] [2]", 1, "'1]'"),
    ('{"token_ids": [1, 2]}', 1, "'{\"token_ids\":'"),
])
def test_token_files_refused_by_hand(text, line, bad):
    with pytest.raises(BadInputError, match=f"^t.txt:{line}: {re.escape(bad)} is not a token id"):
        parse_token_ids(text, "t.txt")


def test_read_token_file_drops_a_bom_and_names_a_missing_file(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes("\ufeff1 2 3".encode())
    assert read_token_file(path) == [1, 2, 3]
    with pytest.raises(BadInputError, match=f"^{tmp_path / 'none'}: cannot read: "):
        read_token_file(tmp_path / "none")
