"""Property tests (hypothesis) over the command line: any option values and any
trace bytes end in exit 0 or 2, never a traceback; a refusal is one line that names the file (and line) when the
file is at fault; and a failed command leaves no key on the server."""
from __future__ import annotations

import json
import re

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.cli.app import app

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TRACE = "".join(json.dumps({"token_ids": list(range(1, n)), "timestamp": t}) + "\n"
                for n, t in ((20, 0), (30, 1), (25, 0.5)))

texts = st.text(max_size=12)
numbers = st.sampled_from(["0", "1", "4", "-1", "-4", "1e3", "1e400", "nan", "inf", "x", "", "99999999999999999999",
                           "3.5", "16,16", "4,,8", "4,8", " 8 ", "0x10"])
sizes = st.sampled_from(["64GiB", "1kb", "12 parsecs", "0", "-1", "1e400", "64G", "3M tokens", "unlimited", "",
                         "1e3", "7 tok", "5B"])


def _opts(**choices):
    """A strategy for ``[flag, value, ...]``: each option present or not, its value drawn from its strategy."""
    return st.fixed_dictionaries({}, optional=choices).map(
        lambda d: [x for flag, value in d.items() for x in (flag, value)])


def _check(out, server: redis.Redis, path: str | None = None) -> None:
    assert out.exit_code in (0, 2), (out.exit_code, out.output, repr(out.exception))
    assert out.exception is None or isinstance(out.exception, SystemExit), repr(out.exception)
    assert "Traceback" not in out.output
    if out.exit_code == 2:
        lines = out.stderr.splitlines()
        err = lines[-1] if lines else ""
        if err.startswith("kvcli: error: "):  # one line, after any notes and progress lines ("[  0.4s] phase")
            assert all(re.match(r"(kvcli: )?(note|warning): |\[ *\d+\.\ds\] ", line) for line in lines[:-1]), out.stderr
            if path and path in err:
                assert re.match(rf"kvcli: error: {re.escape(path)}(:\d+)?: ", err), err
        else:  # the option parser's own usage error (a value of the wrong type)
            err = out.stderr
            assert "Usage:" in err and "Invalid value" in err or "No such option" in err or "Missing" in err, err
        assert server.dbsize() == 0, "a failed command left keys"


@SETTINGS
@given(opts=_opts(**{"--chunk-sizes": numbers, "--capacity-bytes": sizes, "--capacity-tokens": numbers,
                     "--measure": st.sampled_from(["0", "1", "all", "-1", "x", "999"]),
                     "--measure-max-tokens": numbers, "--limit": numbers, "--namespace": texts,
                     "--format": st.sampled_from(["auto", "native", "mooncake", "sharegpt", "lines", "x"]),
                     "--payload": st.sampled_from(["real", "accounted", "x"]),
                     "--prefill-tps": st.sampled_from(["1000", "1000", "1000", "0", "-1", "nan", "1e400", "x"]),
                     "--dtype": st.sampled_from(["float32", "bfloat16", "int3"])}))
def test_replay_options(redis_url, opts, redis_client):
    server = redis_client
    if "--prefill-tps" not in opts:
        opts += ["--prefill-tps", "1000"]
    out = CliRunner().invoke(app, ["replay", "-", "--model", "tiny", "--redis-url", redis_url] + opts, input=TRACE)
    _check(out, server)
    assert server.dbsize() == 0  # a replay's own namespace never outlives it, whatever happened


@SETTINGS
@given(opts=_opts(**{"--chunk-size": numbers, "--node-capacity": sizes, "--nodes": numbers, "--rate": numbers,
                     "--max-batch": numbers, "--decode-tpot": numbers, "--limit": numbers,
                     "--lookup-delay": st.sampled_from(["5ms", "lognormal:1ms:50ms", "x", "-1", "lognormal:1ms"]),
                     "--lookup-timeout": st.sampled_from(["20ms", "0", "x"]),
                     "--sweep": st.sampled_from(["nodes=1,2", "w=", "node-capacity=64G", "x=1", "rate=1,x"])}))
def test_route_options(redis_url, opts, redis_client):
    out = CliRunner().invoke(app, ["route", "-", "-p", "round-robin,prefix", "--prefill-tps", "1000",
                                   "--no-count-rtt"] + opts, input=TRACE)
    _check(out, redis_client)


@SETTINGS
@given(opts=_opts(**{"--chunk-size": numbers, "--ttl": numbers, "--namespace": texts, "--dtype": st.sampled_from(
    ["float32", "int3"]), "--format": st.sampled_from(["auto", "lines", "native", "x"])}),
       dry=st.booleans())
def test_warm_options(redis_url, opts, dry, redis_client):
    server = redis_client
    server.flushall()  # our own private server
    out = CliRunner().invoke(app, ["warm", "-", "--model", "tiny", "--redis-url", redis_url] + opts
                             + (["--dry-run"] if dry else []), input=TRACE)
    _check(out, server)
    if dry:
        assert server.dbsize() == 0


lines = st.one_of(
    st.builds(lambda ids, t: json.dumps({"token_ids": ids, "timestamp": t}),
              st.lists(st.integers(-2, 2**33), max_size=30), st.one_of(st.none(), st.floats(-1, 1e9))),
    st.builds(lambda ids, n: json.dumps({"hash_ids": ids, "input_length": n}),
              st.lists(st.integers(-1, 2**56), max_size=3), st.integers(-1, 2000)),
    st.binary(max_size=30).map(lambda b: b.replace(b"\n", b" ").decode("latin-1")),
    st.sampled_from(['{"prompt": "hello"}', "TIMESTAMP,ContextTokens,GeneratedTokens", "[", "{}", ""]))


@SETTINGS
@given(content=st.lists(lines, min_size=1, max_size=5))
def test_replay_any_trace_bytes(redis_url, tmp_path, content, redis_client):
    path = tmp_path / "trace.jsonl"
    path.write_bytes("\n".join(content).encode("latin-1", "replace") + b"\n")
    server = redis_client
    out = CliRunner().invoke(app, ["replay", str(path), "--model", "tiny", "--chunk-sizes", "4,16", "--measure",
                                   "1", "--prefill-tps", "1000", "--redis-url", redis_url])
    _check(out, server, str(path))
    if out.exit_code == 2:
        assert out.stderr.splitlines()[-1].startswith(f"kvcli: error: {path}"), out.stderr
    assert server.dbsize() == 0
