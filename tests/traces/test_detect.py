"""Format detection (kvcli/traces/detect.py): a first record that fits two formats' signatures is refused, whichever
two; a file named as JSON whose first line is a JSON value other than an object is refused, not read as prompts."""
from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.traces.detect import detect_format, read_trace

# One record key set per format, each fitting that format's signature alone, in the order detection names them.
SIGNATURES = {
    "mooncake": {"hash_ids": [0], "input_length": 1},
    "claude-code": {"requests": [], "hash_id_scope": "local"},
    "sharegpt": {"conversations": []},
    "swe-agent": {"history": []},
    "openai-batch": {"custom_id": "a", "body": {"prompt": "x"}},
    "gateway": {"request_body": {"prompt": "x"}, "startTime": "2025-01-01T00:00:00"},
    "native": {"token_ids": [1]},
}


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def refusal(path: Path, record: dict, formats: list[str]) -> str:
    """The documented refusal of a first record that fits ``formats``."""
    keys = ", ".join(sorted(record)[:10])
    return (f"{path}:1: ambiguous trace format: the first record's keys ({keys}) fit {' and '.join(formats)}; "
            f"pass the format by name (--format {' or --format '.join(formats)}; kvcli export: --input-format)")


@pytest.mark.parametrize("name", SIGNATURES)
def test_each_signature_alone_is_its_format(tmp_path, name):
    assert detect_format(write_lines(tmp_path / "t.jsonl", [json.dumps(SIGNATURES[name])])) == name


@pytest.mark.parametrize("first, second", list(itertools.combinations(SIGNATURES, 2)))
def test_a_first_record_that_fits_any_two_formats_is_refused_naming_both(tmp_path, first, second):
    record = {**SIGNATURES[first], **SIGNATURES[second]}
    path = write_lines(tmp_path / "t.jsonl", [json.dumps(record)])
    with pytest.raises(BadInputError) as info:
        detect_format(path)
    assert str(info.value) == refusal(path, record, [first, second])


@pytest.mark.parametrize("record, formats", [
    ({"token_ids": [1], "hash_ids": [0], "input_length": 1, "chat_id": 1}, ["bailian", "native"]),
    ({"prompt": "a", "hash_ids": [0], "input_length": 1, "block_size": 16}, ["hash-ids", "native"]),
    ({"hash_ids": [0], "input_length": 1, "requests": [], "block_size": 64}, ["hash-ids", "claude-code"]),
    ({"conversations": [], "prompt": "a"}, ["sharegpt", "native"]),                  # a ShareGPT_V3 row as JSONL
    ({"history": [], "messages": []}, ["swe-agent", "native"]),
    ({**SIGNATURES["mooncake"], **SIGNATURES["sharegpt"], **SIGNATURES["native"]}, ["mooncake", "sharegpt", "native"]),
])
def test_hash_id_sharegpt_and_swe_agent_keys_beside_others_are_refused(tmp_path, record, formats):
    path = write_lines(tmp_path / "t.jsonl", [json.dumps(record)])
    with pytest.raises(BadInputError) as info:
        detect_format(path)
    assert str(info.value) == refusal(path, record, formats)


def test_the_documented_field_precedences_stay(tmp_path):
    """Bailian's fields and ``block_size`` tell the hash-id formats apart; a gateway row's ``messages`` alone does
    not make it native (docs/traces.md)."""
    both = {"hash_ids": [0], "input_length": 1, "block_size": 16, "chat_id": 1}
    assert detect_format(write_lines(tmp_path / "b.jsonl", [json.dumps(both)])) == "bailian"
    row = {"messages": [{"role": "user", "content": "a"}], "request_body": {"prompt": "x"}, "startTime": 0}
    assert detect_format(write_lines(tmp_path / "g.jsonl", [json.dumps(row)])) == "gateway"


def test_token_ids_beside_hash_ids_exit_2_through_the_cli_and_read_by_name(tmp_path):
    rows = [{"token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "hash_ids": [0], "input_length": 8, "timestamp": 0},
            {"token_ids": [1, 2, 3, 4, 5, 6, 7, 9], "hash_ids": [0], "input_length": 8, "timestamp": 1}]
    path = write_lines(tmp_path / "a.jsonl", [json.dumps(r) for r in rows])
    out = CliRunner().invoke(app, ["stats", str(path), "--json"])
    assert out.exit_code == 2
    assert out.stderr == f"kvcli: error: {refusal(path, rows[0], ['mooncake', 'native'])}\n"
    assert [r.token_ids.tolist() for r in read_trace(path, "native")] == [r["token_ids"] for r in rows]
    named = CliRunner().invoke(app, ["stats", str(path), "--format", "native", "--json"])
    assert named.exit_code == 0, named.output
    assert json.loads(named.stdout)["traces"][0]["shared_prefix_tokens"] == 7


# ------------------------------------------------------------------------- a first line that is not an object

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=20))
KINDS = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_scalars, blank_lines=st.integers(0, 2),
       name=st.sampled_from(["t.jsonl", "t.json", "t.ndjson", "T.JSONL", "t.jsonl.gz"]))
def test_a_json_named_file_whose_first_line_is_not_an_object_is_refused_there(tmp_path, value, blank_lines, name):
    text = "\n" * blank_lines + json.dumps(value) + '\n{"prompt": "hello"}\n'
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    with pytest.raises(BadInputError) as info:
        detect_format(path)
    assert str(info.value) == (f"{path}:{blank_lines + 1}: the first record is {KINDS[type(value)]}, not a JSON "
                               "object: each line of a JSONL trace is one object (--format lines reads the file as "
                               "one prompt per line)")


@pytest.mark.parametrize("first", ["null", "5", '"hi"', "true"])
def test_a_jsonl_file_starting_with_a_json_value_exits_2_and_a_txt_file_stays_prompt_lines(tmp_path, first):
    jsonl = write_lines(tmp_path / "f.jsonl", [first, '{"prompt": "hello there"}'])
    out = CliRunner().invoke(app, ["stats", str(jsonl), "--json"])
    assert out.exit_code == 2
    assert out.stderr.startswith(f"kvcli: error: {jsonl}:1: the first record is ")
    assert [r.id for r in read_trace(jsonl, "lines")] == [f"{jsonl}:1", f"{jsonl}:2"]
    txt = write_lines(tmp_path / "f.txt", [first, '{"prompt": "hello there"}'])
    assert detect_format(txt) == "lines" and len(list(read_trace(txt))) == 2


@pytest.mark.parametrize("name, first", [("f.jsonl", "hello world"), ("f.jsonl", "5 apples"), ("f", "null"),
                                         ("f.log", '"quoted"')])
def test_text_that_is_not_json_or_a_file_not_named_json_is_still_prompt_lines(tmp_path, name, first):
    assert detect_format(write_lines(tmp_path / name, [first, '{"prompt": "x"}'])) == "lines"
