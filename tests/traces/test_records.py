"""kvcli.traces.records: the longest line a reader takes (refused while streaming, memory bounded) and read errors
that name their file and line, gzip cut short included."""
from __future__ import annotations

import gzip
import json
import tracemalloc

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.traces import records
from kvcli.traces.detect import read_trace


def _error(path, fmt: str = "auto") -> str:
    with pytest.raises(BadInputError) as info:
        list(read_trace(path, fmt))
    return str(info.value)


@pytest.mark.parametrize("compress", [False, True])
def test_a_line_over_the_limit_is_refused_with_its_file_and_line(tmp_path, monkeypatch, compress):
    monkeypatch.setattr(records, "MAX_LINE_BYTES", 1000)
    text = (json.dumps({"token_ids": [1, 2, 3]}) + "\n\n" + json.dumps({"token_ids": list(range(400))}) + "\n"
            + json.dumps({"token_ids": [4]}) + "\n").encode()
    path = tmp_path / ("t.jsonl.gz" if compress else "t.jsonl")
    path.write_bytes(gzip.compress(text) if compress else text)
    message = _error(path)
    assert message.startswith(f"{path}:3: line longer than 1,000 B, the longest trace line kvcli reads")
    assert "\n" not in message
    monkeypatch.setattr(records, "MAX_LINE_BYTES", len(text))  # every line fits: all three are read
    assert [len(r.token_ids) for r in read_trace(path)] == [3, 400, 1]


def test_a_line_over_the_limit_is_never_held_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "MAX_LINE_BYTES", 4096)
    path = tmp_path / "long.jsonl"
    path.write_bytes(b'{"prompt": "' + b"a" * (16 << 20) + b'"}\n')  # 16 MiB, 4,096 times the limit
    tracemalloc.start()
    try:
        message = _error(path, "native")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message.startswith(f"{path}:1: line longer than 4.0 KiB")
    assert peak < 4 << 20  # a small part of the line's 16 MiB was ever in memory


def test_the_cli_refuses_a_long_line_with_exit_2_and_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "MAX_LINE_BYTES", 100)
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"token_ids": [1]}) + "\n" + json.dumps({"token_ids": list(range(100))}) + "\n")
    out = CliRunner().invoke(app, ["warm", str(path), "--dry-run", "--chunk-size", "4"])
    assert out.exit_code == 2, out.output
    assert out.stderr.strip().splitlines() == [f"kvcli: error: {path}:2: line longer than 100 B, the longest trace "
                                               "line kvcli reads (each record is parsed whole); split the record "
                                               "or shorten its prompt"]


def test_the_limit_is_64_mib():
    assert records.MAX_LINE_BYTES == 64 << 20


@pytest.mark.parametrize("fmt", ["auto", "native"])
def test_gzip_cut_inside_its_last_line_names_that_line(tmp_path, fmt):
    data = gzip.compress("".join(json.dumps({"token_ids": [i, i + 1]}) + "\n" for i in range(3)).encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[:-12])  # the trailer and the end of line 3's compressed data are gone
    message = _error(path, fmt)
    assert message.startswith(f"{path}:3: cannot read past line 2 (EOFError: "), message


def test_gzip_json_document_cut_short_names_a_line(tmp_path):
    conversation = {"id": "c", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    data = gzip.compress(json.dumps([conversation] * 3, indent=1).encode())
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[:-12])
    lines = json.dumps([conversation] * 3, indent=1).count("\n") + 1
    message = _error(path)
    assert message.startswith(f"{path}:"), message
    line = int(message[len(str(path)) + 1:].split(":", 1)[0])
    assert lines // 2 < line <= lines and "EOFError" in message  # where the data stops, not line 1
