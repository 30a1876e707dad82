"""The options several commands share (kvcli/cli/options.py): one chunk-size parser, and ``--redis-timeout`` on
every command that talks to Redis, down to the client it connects."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.cli.options import parse_chunk_sizes
from kvcli.errors import BadInputError

TOKENS = "".join(json.dumps({"token_ids": list(range(1, 10)), "timestamp": t}) + "\n" for t in (0, 1))

# every command that opens Redis, with what it needs to run on a small input (stdin: TOKENS)
COMMANDS = {
    "replay": ["replay", "-", "--chunk-sizes", "4", "--measure", "0", "--prefill-tps", "1000", "--payload",
               "accounted", "--jobs", "1"],
    "warm": ["warm", "-", "--model", "tiny", "--chunk-size", "4", "--dry-run"],
    "inspect": ["inspect"],
    "inspect-map": ["inspect", "--tokens", "-"],  # replaced by a file in the test
    "inspect-lmcache": ["inspect", "--layout", "lmcache"],
    "purge": ["purge", "--namespace", "ns"],
    "route": ["route", "-", "-p", "cache-manager", "--chunk-size", "4", "--nodes", "1", "--prefill-tps", "1000",
              "--no-count-rtt"],
}


def _args(name: str, tmp_path) -> list[str]:
    args = list(COMMANDS[name])
    if name == "inspect-map":
        tokens = tmp_path / "tokens.txt"
        tokens.write_text("1 2 3 4 5 6 7 8 9")
        args[-1] = str(tokens)
    return args


@pytest.mark.parametrize("text, sizes", [
    ("16", (16,)),
    ("16,64,256,1024", (16, 64, 256, 1024)),
    ("16,16", (16,)),
    ("64,16,64,16", (64, 16)),  # a repeat is dropped, the first kept, in order
    (" 16 , 64 ,", (16, 64)),
])
def test_chunk_sizes_parse(text, sizes):
    assert parse_chunk_sizes(text) == sizes


@pytest.mark.parametrize("text", ["", ",", "0", "16,0", "-16", "16,x", "1.5", "16;64"])
def test_chunk_sizes_refused(text):
    with pytest.raises(BadInputError, match=f"--chunk-sizes must be positive integers separated by commas, "
                                            f"got {text!r}"):
        parse_chunk_sizes(text)


@pytest.mark.parametrize("command", ["replay", "warm", "inspect-map"])
@pytest.mark.parametrize("flag", ["--chunk-size", "--chunk-sizes"])
def test_every_chunk_sizes_option_is_read_alike(command, flag, tmp_path):
    """replay, warm and inspect's chunk map read their chunk sizes with the one parser, before connecting."""
    out = CliRunner().invoke(app, _args(command, tmp_path) + [flag, "16,x", "--redis-url", "redis://127.0.0.1:1"],
                             input=TOKENS)
    assert out.exit_code == 2, out.output
    assert out.stderr == "kvcli: error: --chunk-sizes must be positive integers separated by commas, got '16,x'\n"


@pytest.mark.single_server("the option reaches connect() the same way for a cluster")
@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_redis_command_refuses_a_zero_timeout(name, redis_url, tmp_path):
    out = CliRunner().invoke(app, _args(name, tmp_path) + ["--redis-url", redis_url, "--redis-timeout", "0"],
                             input=TOKENS)
    assert out.exit_code == 2, out.output
    assert out.stderr == "kvcli: error: --redis-timeout must be > 0, got '0'\n"


@pytest.mark.single_server("the option reaches connect() the same way for a cluster")
@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_redis_command_connects_with_its_timeout(name, redis_url, tmp_path, monkeypatch):
    """The client each command talks to was made with ``--redis-timeout`` (750 ms, not the 10 s default): its
    connections' socket timeout says so."""
    import kvcli.store.server as server
    from kvcli.replay.parallel import reply_timeout

    made, connect = [], server.connect

    def spy(url, timeout=None):
        client = connect(url, timeout)
        made.append(reply_timeout(client))
        return client

    monkeypatch.setattr(server, "connect", spy)
    out = CliRunner().invoke(app, _args(name, tmp_path) + ["--redis-url", redis_url, "--redis-timeout", "750ms"],
                             input=TOKENS)
    assert out.exit_code == 0, out.output
    assert made and set(made) == {0.75}



@pytest.mark.parametrize("name", ["purge", "route"])
def test_a_command_of_one_chunk_size_refuses_two_in_one_line(name, tmp_path):
    out = CliRunner().invoke(app, _args(name, tmp_path) + ["--chunk-size", "16,64"], input=TOKENS)
    assert out.exit_code == 2, out.output
    assert out.stderr.strip().splitlines()[-1] == "kvcli: error: --chunk-size takes one size here, got '16,64'"


def test_purge_of_an_empty_namespace_says_there_is_nothing_to_delete(redis_url):
    out = CliRunner().invoke(app, ["purge", "--namespace", "empty", "--redis-url", redis_url])
    assert out.exit_code == 0, out.output
    assert out.stdout.strip() == "nothing to delete: namespace 'empty' holds no kvcli keys"


def test_a_bad_redis_timeout_names_the_option_and_where_it_came_from():
    out = CliRunner().invoke(app, ["purge", "--namespace", "x", "--redis-timeout", "abc"])
    assert out.exit_code == 2 and out.stderr.strip().splitlines()[-1].startswith("kvcli: error: --redis-timeout: ")
    out = CliRunner().invoke(app, ["purge", "--namespace", "x"], env={"KVCLI_REDIS_TIMEOUT": "0"})
    assert out.exit_code == 2
    assert out.stderr.strip().splitlines()[-1] == ("kvcli: error: --redis-timeout must be > 0, got '0' "
                                                  "(from $KVCLI_REDIS_TIMEOUT)")


@pytest.mark.parametrize("args", [
    ["replay", "-", "--chunk-sizes", "4", "--measure", "1"],
    ["warm", "-", "--model", "tiny", "--chunk-size", "4"],
    ["route", "-", "--chunk-size", "4", "--nodes", "1"],
    ["profile", "--model", "tiny", "--out", "p.json"],
], ids=lambda a: a[0])
def test_every_command_that_runs_a_model_takes_threads(args):
    """replay, warm, route and profile read ``--threads`` alike and refuse 0 before they connect or load a model."""
    out = CliRunner().invoke(app, args + ["--threads", "0", "--redis-url", "redis://127.0.0.1:1"]
                             if args[0] != "profile" else args + ["--threads", "0"], input=TOKENS)
    assert out.exit_code == 2, out.output
    assert out.stderr.splitlines()[-1] == "kvcli: error: --threads must be >= 1, got 0"


SEEDED = ["replay", "warm", "inspect", "inspect-map", "route"]  # every command with --seed (and inspect's map)


def test_the_seeded_commands_are_every_command_with_a_seed():
    from typer.main import get_command

    commands = get_command(app).commands  # type: ignore[attr-defined]
    with_seed = {name for name, command in commands.items() if any("--seed" in p.opts for p in command.params)}
    assert with_seed == {name.partition("-")[0] for name in SEEDED}


@pytest.mark.single_server("a refusal before any work is the same on a cluster")
@pytest.mark.parametrize("seed", ["-1", str(2**63), "99999999999999999999999"])
@pytest.mark.parametrize("name", SEEDED)
def test_every_seed_option_refuses_a_seed_out_of_range_before_any_work(name, seed, redis_url, redis_client,
                                                                       tmp_path):
    """One line and exit 2, before a trace is read or a key written (warm without --dry-run: it would write)."""
    args = [a for a in _args(name, tmp_path) if a != "--dry-run"]
    out = CliRunner().invoke(app, args + ["--seed", seed, "--redis-url", redis_url], input=TOKENS)
    assert out.exit_code == 2, out.output
    assert out.stderr == f"kvcli: error: --seed must be an integer in [0, 2**63 - 1], got {seed}\n"
    assert out.stdout == "" and redis_client.dbsize() == 0


@pytest.mark.single_server("the seed's range is the same on a cluster")
@pytest.mark.parametrize("name", ["replay", "warm", "route"])
def test_every_seed_option_takes_the_largest_seed(name, redis_url, tmp_path):
    out = CliRunner().invoke(app, _args(name, tmp_path) + ["--seed", str(2**63 - 1), "--redis-url", redis_url],
                             input=TOKENS)
    assert out.exit_code == 0, out.output


@pytest.mark.parametrize("seed", [-1, 2**63, True, 1.0, "1"])
def test_check_seed_refuses(seed):
    from kvcli.units import check_seed

    with pytest.raises(BadInputError, match=r"^--seed must be an integer in \[0, 2\*\*63 - 1\], got "):
        check_seed(seed)
