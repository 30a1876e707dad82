"""Which files a directory contributes (kvcli/traces/paths.py), and what a directory without any says it holds."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.traces.paths import expand_paths

NONE = "directory holds no prompt (.txt) or trace files: "
CSV_NOTE = "(kvcli reads CSV and TSV only as a gateway log, and only when named: name the file)"
SUBDIR_NOTE = "(kvcli does not search subdirectories: name them)"
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"


def refused(directory: Path) -> str:
    with pytest.raises(BadInputError) as info:
        expand_paths([directory])
    return str(info.value)


def test_a_directory_of_csv_files_says_csv_is_read_only_when_named(tmp_path):
    for name in ("code.csv", "conv.TSV.gz"):
        (tmp_path / name).write_text(AZURE)
    assert refused(tmp_path) == f"{tmp_path}: {NONE}it holds only 2 CSV or TSV files {CSV_NOTE}"
    out = CliRunner().invoke(app, ["stats", str(tmp_path)])
    assert out.exit_code == 2
    assert out.stderr == f"kvcli: error: {tmp_path}: {NONE}it holds only 2 CSV or TSV files {CSV_NOTE}\n"
    named = CliRunner().invoke(app, ["stats", str(tmp_path / "code.csv")])
    assert named.exit_code == 2 and "an Azure LLM inference trace" in named.stderr


def test_a_directory_of_subdirectories_says_they_are_not_searched(tmp_path):
    (tmp_path / "mooncake").mkdir()
    assert refused(tmp_path) == f"{tmp_path}: {NONE}it holds only 1 subdirectory {SUBDIR_NOTE}"
    (tmp_path / "azure").mkdir()
    out = CliRunner().invoke(app, ["stats", str(tmp_path)])
    assert out.exit_code == 2
    assert out.stderr == f"kvcli: error: {tmp_path}: {NONE}it holds only 2 subdirectories {SUBDIR_NOTE}\n"


def test_an_empty_directory_and_one_of_everything_skipped(tmp_path):
    assert refused(tmp_path) == f"{tmp_path}: {NONE}it is empty"
    (tmp_path / "one.csv").write_text(AZURE)
    (tmp_path / "sub").mkdir()
    (tmp_path / "README.md").write_text("notes")
    (tmp_path / ".hidden.jsonl").write_text("{}")
    assert refused(tmp_path) == (f"{tmp_path}: {NONE}it holds 1 CSV or TSV file {CSV_NOTE}; 1 subdirectory "
                                 f"{SUBDIR_NOTE}; 2 other files skipped (hidden files, notes, scripts, plots)")


def test_a_directory_with_a_trace_file_contributes_it_alone(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.csv").write_text(AZURE)
    (tmp_path / "b.tsv").write_text(AZURE.replace(",", "\t"))
    (tmp_path / "t.jsonl").write_text('{"prompt": "a"}\n')
    (tmp_path / "p.txt").write_text("a\n")
    assert expand_paths([tmp_path]) == [tmp_path / "p.txt", tmp_path / "t.jsonl"]
