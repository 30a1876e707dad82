"""A replay priced with a profile measured elsewhere (``--prefill-profile``): deterministic savings, the profile's
range said, a profile of another model refused."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app

TRACE = "".join(json.dumps({"token_ids": list(range(1, n)), "timestamp": t}) + "\n"
                for n, t in ((300, 0), (500, 1), (400, 2), (900, 3)))


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """A CPU profile of the tiny preset up to 512 tokens (prompts beyond it are extrapolated: the report says)."""
    path = tmp_path_factory.mktemp("profile") / "tiny.json"
    # 3 repeats (the fastest of each point is fitted): a noisy 4-point fit whose cached-pair term e nears 1.5x the
    # causal term d would price these hits' savings at or below 0 (a 2-repeat profile once failed this test in CI)
    out = CliRunner().invoke(app, ["profile", "--model", "tiny", "--device", "cpu", "--max-tokens", "512",
                                   "--repeats", "3", "--out", str(path)])
    assert out.exit_code == 0, out.output
    return path


def _replay(tmp_path, redis_url, *args):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    # --jobs 1: this process alone (worker processes start in seconds, and give the same report: test_parallel)
    return CliRunner().invoke(app, ["replay", str(trace), "--payload", "accounted", "--chunk-sizes", "16,64",
                                    "--redis-url", redis_url, "--json", "--jobs", "1", *args])


def test_a_profile_prices_the_same_savings_every_run(tmp_path, redis_url, profile):
    runs = [_replay(tmp_path, redis_url, "--model", "tiny", "--prefill-profile", str(profile)) for _ in range(2)]
    docs = []
    for out in runs:
        assert out.exit_code == 0, out.output
        docs.append(json.loads(out.stdout))
    savings = [[r["savings"]["saved_prefill_seconds"] for r in d["traces"][0]["per_chunk_size"]] for d in docs]
    assert savings[0] == savings[1]
    (t,) = docs[0]["traces"]
    assert t["measured_requests"] == 0 and docs[0]["context"]["device"] == "no device (model not run)"
    assert docs[0]["context"]["cost_curve_source"] == f"profile: {profile} (measured)"
    assert docs[0]["context"]["device_rates"]["load_bytes_per_second"] > 0
    # the profile's longest full prefill is 512 tokens: R2 (499 tokens) is inside, R4 (899) beyond it
    beyond = [r["savings"]["saved_beyond_calibration_share"] for r in t["per_chunk_size"]]
    assert all(0 < b < 1 for b in beyond)
    assert any("longer than the longest calibrated full prefill (512 tokens" in n for n in t["notes"])


def test_a_profile_of_another_model_is_refused_in_one_line(tmp_path, redis_url, profile):
    out = _replay(tmp_path, redis_url, "--model", "cpu", "--prefill-profile", str(profile))
    assert out.exit_code == 2, out.output
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith(f"kvcli: error: {profile}: --prefill-profile: the profile was measured with --model tiny")


def test_a_file_that_is_not_a_profile_is_refused(tmp_path, redis_url):
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"format": "something-else"}')
    out = _replay(tmp_path, redis_url, "--model", "tiny", "--prefill-profile", str(bogus))
    assert out.exit_code == 2 and str(bogus) in out.stderr, out.output


def test_two_ways_to_price_prefill_are_refused(tmp_path, redis_url, profile):
    out = _replay(tmp_path, redis_url, "--model", "tiny", "--prefill-profile", str(profile), "--prefill-tps", "5")
    assert out.exit_code == 2 and "--prefill-tps and --prefill-profile both price prefill" in out.stderr


def test_run_replay_takes_one_path_as_given_and_runs_in_this_process_by_default(tmp_path):
    """A library caller's ``run_replay(client, target, "trace.jsonl", ...)``: one path as it is, and ``jobs=1`` by
    default (worker processes from a script need its ``__main__`` guard)."""
    import kvcli

    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    config = kvcli.ReplayConfig(chunk_sizes=(16,), payload="accounted", measure=0)
    with kvcli.open_redis() as (client, target):
        results, context = kvcli.run_replay(client, target, str(trace), config, kvcli.ModelOptions(prefill_tps=3000))
    assert [r.hit_tokens for r in results[0].per_chunk_size] == [288 + 384 + 496]
    assert context["units"] == "this process"
