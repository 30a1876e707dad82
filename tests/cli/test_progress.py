"""replay's progress on stderr where no terminal is attached: one line per phase, from the first second, and each
trace's summary line as soon as that trace is done (before the next trace starts)."""
from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from kvcli.cli.app import app

PHASE = re.compile(r"\[ *\d+\.\ds\] (.*)")
CLEANUP = "cleaning up: deleting namespace replay-*"


def test_each_phase_is_a_line_and_each_summary_comes_as_its_trace_ends(tmp_path, redis_url):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"token_ids": list(range(1, 9))}) + "\n" for _ in range(2)))
    b.write_text("".join(json.dumps({"token_ids": list(range(1, 13))}) + "\n" for _ in range(2)))
    out = CliRunner().invoke(app, ["replay", str(a), str(b), "--model", "tiny", "--measure", "1", "--chunk-sizes",
                                   "4", "--calibrate-seconds", "0", "--redis-url", redis_url, "--json"])
    assert out.exit_code == 0, out.output
    lines = out.stderr.splitlines()
    shown = [re.sub(r"replay-\S+", "replay-*", PHASE.fullmatch(line)[1]) if PHASE.fullmatch(line)
             else line.split(":")[0] for line in lines]
    assert shown == [f"connecting to Redis at {redis_url}", "checking 2 traces",
                     "loading the model kvcli/tiny@seed0:fp32", "calibrating prefill on cpu: timing the base points",
                     f"trace 1 of 2: {a}", f"reading {a}", f"replaying {a}: 2 requests x 1 store",
                     CLEANUP, str(a),
                     f"trace 2 of 2: {b}", f"reading {b}", f"replaying {b}: 2 requests x 1 store", CLEANUP, str(b)]
    # a: R2 reuses chunk [1-4] [5-8] minus its last token: 7 of 16; b: 11 of 24
    assert " hit 43.8%; " in lines[8] and " hit 45.8%; " in lines[13]
    assert [t["trace"] for t in json.loads(out.stdout)["traces"]] == [str(a), str(b)]


def test_a_replay_that_runs_no_model_says_where_its_redis_is_first(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text(json.dumps({"token_ids": [1, 2, 3, 4, 5]}) + "\n")
    out = CliRunner().invoke(app, ["replay", str(a), "--measure", "0", "--prefill-tps", "1000", "--chunk-sizes", "4",
                                   "--payload", "accounted"], env={"REDIS_URL": None})
    assert out.exit_code == 0, out.output
    phases = [re.sub(r"replay-\S+", "replay-*", PHASE.fullmatch(line)[1]) for line in out.stderr.splitlines()
              if PHASE.fullmatch(line)]
    assert phases == ["starting the embedded Redis server", f"trace 1 of 1: {a}", f"reading {a}",
                      f"replaying {a}: 1 request x 1 store", CLEANUP]


def test_a_bad_trace_is_refused_before_the_model_loads(tmp_path, redis_url):
    """The second trace's bad line fails the run in the check, before tens of seconds of model load and calibration."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"token_ids": [1, 2, 3, 4, 5]}) + "\n")
    b.write_text(json.dumps({"token_ids": [1, 2]}) + "\n" + '{"token_ids": [1,\n')
    out = CliRunner().invoke(app, ["replay", str(a), str(b), "--model", "tiny", "--measure", "1", "--chunk-sizes",
                                   "4", "--redis-url", redis_url])
    assert out.exit_code == 2, out.output
    lines = out.stderr.splitlines()
    assert [PHASE.fullmatch(line)[1] for line in lines[:-1]] == [f"connecting to Redis at {redis_url}",
                                                                 "checking 2 traces"]
    assert lines[-1].startswith(f"kvcli: error: {b}:2: invalid JSON")


def test_an_index_only_replay_checks_every_trace_before_the_first_report(tmp_path, redis_url):
    """Two traces, the second bad: refused in the check, before the first trace's report is made and lost."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"token_ids": [1, 2, 3, 4, 5]}) + "\n")
    b.write_text('{"token_ids": [1,\n')
    out = CliRunner().invoke(app, ["replay", str(a), str(b), "--measure", "0", "--prefill-tps", "1000",
                                   "--chunk-sizes", "4", "--payload", "accounted", "--redis-url", redis_url])
    assert out.exit_code == 2, out.output
    lines = out.stderr.splitlines()
    assert [PHASE.fullmatch(line)[1] for line in lines[:-1]] == [f"connecting to Redis at {redis_url}",
                                                                 "checking 2 traces"]
    assert lines[-1].startswith(f"kvcli: error: {b}:1: invalid JSON")
