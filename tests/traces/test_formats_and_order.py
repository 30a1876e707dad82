"""One set of input rules for every command: CSV traces refused alike by replay, route and warm; text
that is not UTF-8 named by file and line (stdin too, in any locale); and one request order, timestamps first."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.traces.prompts import read_prompts

AZURE = Path("/work/shared/traces/azure/AzureLLMInferenceTrace_code.csv")
AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
AZURE_WHY = ("an Azure LLM inference trace (TIMESTAMP, ContextTokens, GeneratedTokens): it records prompt lengths "
             "only, no prompt text, token ids or block hashes, so which prompts share a prefix is unknown and no "
             "cache hit can be derived; kvcli does not read it (use a trace with prompts, token_ids or Mooncake "
             "hash_ids)")
FAST = ["--prefill-tps", "1000"]


@pytest.fixture
def azure(tmp_path) -> Path:
    """The public Azure trace's first rows (the whole file when the shared copy is there)."""
    if AZURE.exists():
        return AZURE
    path = tmp_path / "AzureLLMInferenceTrace_code.csv"
    path.write_text(AZURE_HEAD)
    return path


@pytest.mark.parametrize("command", [
    ["replay", "--measure", "0", "--payload", "accounted"] + FAST,
    ["route"] + FAST,
    ["warm", "--model", "tiny"],
])
def test_an_azure_csv_is_refused_by_every_command(redis_url, azure, command, redis_client):
    for source, stdin, where in ((str(azure), None, f"{azure}:1"), ("-", AZURE_HEAD, "<stdin>:1")):
        args = command[:1] + [source] + command[1:] + (["--redis-url", redis_url] if command[0] != "route" else [])
        out = CliRunner().invoke(app, args, input=stdin)
        assert out.exit_code == 2, out.output
        *progress, error = out.stderr.splitlines()  # replay's phase lines come first
        assert error == f"kvcli: error: {where}: {AZURE_WHY}"
        assert all(re.fullmatch(r"\[ *\d+\.\ds\] .*", line) for line in progress), out.stderr
    assert redis_client.dbsize() == 0


def test_warm_refuses_any_csv_unless_told_to_read_lines(redis_url, tmp_path, redis_client):
    table = tmp_path / "prompts.csv"
    table.write_text("name,text\na,hello there\n")
    args = ["warm", str(table), "--model", "tiny", "--chunk-size", "2", "--redis-url", redis_url, "--json"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2
    assert out.stderr == (f"kvcli: error: {table}: a CSV file: kvcli reads CSV only as a gateway log (a header with a "
                          "request column, proxy_server_request, request_body, request or messages, and a time "
                          "column, startTime, start_time, created_at, timestamp); --format lines reads it as one "
                          "prompt per line\n")
    assert redis_client.dbsize() == 0
    lines = CliRunner().invoke(app, args + ["--format", "lines"])
    assert lines.exit_code == 0, lines.output
    assert json.loads(lines.stdout)["prompts"] == 2


def test_warm_names_the_line_of_text_that_is_not_utf8(redis_url, tmp_path, redis_client):
    bad = tmp_path / "prompts.txt"
    bad.write_bytes(b"first prompt\nsecond \xff prompt\n")
    out = CliRunner().invoke(app, ["warm", str(bad), "--model", "tiny", "--redis-url", redis_url])
    assert out.exit_code == 2
    assert out.stderr == f"kvcli: error: {bad}:2: not UTF-8 text (byte 0xff at column 8); prompts must be UTF-8\n"
    out = CliRunner().invoke(app, ["warm", "-", "--model", "tiny", "--redis-url", redis_url],
                             input=b"first prompt\nsecond \xff prompt\n")
    assert out.exit_code == 2
    assert out.stderr == "kvcli: error: <stdin>:2: not UTF-8 text (byte 0xff at column 8); prompts must be UTF-8\n"
    assert redis_client.dbsize() == 0


def test_stdin_decoded_by_a_c_locale_is_checked_as_bytes():
    """A text stream that decoded invalid bytes as surrogates (the C locale's way) gives the same error."""
    stdin = io.TextIOWrapper(io.BytesIO(b"ok\nbad \xfe\n"), encoding="ascii", errors="surrogateescape")
    stdin = io.StringIO(stdin.read())  # a plain text stream, no .buffer: only the decoded text is left
    with pytest.raises(BadInputError) as err:
        read_prompts(["-"], stdin=stdin)
    assert str(err.value) == "<stdin>:2: not UTF-8 text (byte 0xfe at column 5); prompts must be UTF-8"


@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_warm_stdin_not_utf8_in_any_locale(redis_url, locale, redis_client):
    env = {**os.environ, "LC_ALL": locale, "LANG": locale}
    env.pop("PYTHONUTF8", None)
    proc = subprocess.run([sys.executable, "-m", "kvcli", "warm", "-", "--model", "tiny", "--redis-url", redis_url],
                          input=b"ok\nbad \xfe\n", capture_output=True, timeout=120, env=env,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2
    assert proc.stderr == b"kvcli: error: <stdin>:2: not UTF-8 text (byte 0xfe at column 5); prompts must be UTF-8\n"
    assert redis_client.dbsize() == 0


MOONCAKE = "".join(json.dumps({"timestamp": t, "input_length": 600, "output_length": 10, "hash_ids": ids}) + "\n"
                   for t, ids in ((0, [1, 11]), (2000, [1, 13]), (1000, [2, 12])))
ORDER_NOTE = ("is not sorted by timestamp (2 of 3 requests out of place): requests are taken in timestamp order "
              "(stable), the order every kvcli command uses")


def test_route_and_replay_take_an_unsorted_trace_in_one_order(redis_url, tmp_path):
    """Timestamps 0, 2000, 1000 ms; one 512-token chunk each; room for one chunk. In timestamp order [1,11] then
    [2,12] evicts block 1 before [1,13] comes: 0 of 1,800 hit tokens, in both commands, each saying it reordered."""
    trace = tmp_path / "mc.jsonl"
    trace.write_text(MOONCAKE)
    route = CliRunner().invoke(app, ["route", str(trace), "--chunk-size", "512", "--node-capacity", "512 tokens",
                                     "--nodes", "1", "-p", "round-robin", "--no-count-rtt", "--json"] + FAST)
    assert route.exit_code == 0, route.output
    (doc,) = json.loads(route.stdout)["traces"]
    assert (doc["runs"][0]["hit_tokens"], doc["runs"][0]["prompt_tokens"]) == (0, 1800)
    assert doc["notes"] == [f"mc.jsonl {ORDER_NOTE}"] and f"kvcli: note: mc.jsonl {ORDER_NOTE}" in route.stderr
    replay = CliRunner().invoke(app, ["replay", str(trace), "--chunk-size", "512", "--capacity-tokens", "512",
                                      "--measure", "0", "--payload", "accounted", "--json", "--redis-url",
                                      redis_url] + FAST)
    assert replay.exit_code == 0, replay.output
    (t,) = json.loads(replay.stdout)["traces"]
    assert (t["per_chunk_size"][0]["hit_tokens"], t["per_chunk_size"][0]["prompt_tokens"]) == (0, 1800)
    assert t["notes"][0] == f"{trace} {ORDER_NOTE}"
    sorted_trace = tmp_path / "sorted.jsonl"
    sorted_trace.write_text("".join(sorted(MOONCAKE.splitlines(True), key=lambda x: json.loads(x)["timestamp"])))
    again = CliRunner().invoke(app, ["replay", str(sorted_trace), "--chunk-size", "512", "--capacity-tokens", "512",
                                     "--measure", "0", "--payload", "accounted", "--json", "--redis-url",
                                     redis_url] + FAST)
    (t,) = json.loads(again.stdout)["traces"]
    assert t["per_chunk_size"][0]["hit_tokens"] == 0 and not any("sorted" in n for n in t["notes"])


def test_warm_takes_a_trace_in_timestamp_order_too(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"token_ids": [i], "timestamp": t}) + "\n" for i, t in ((1, 5), (2, 1))))
    heard = []
    got = read_prompts([str(trace)], notify=heard.append)
    assert [r.token_ids.tolist() for r in got] == [[2], [1]]
    assert heard == [f"note: {trace} is not sorted by timestamp (2 of 2 requests out of place): requests are taken "
                     f"in timestamp order (stable), the order every kvcli command uses"]
