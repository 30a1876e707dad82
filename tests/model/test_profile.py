"""kvcli.model.profile and ``kvcli profile``: the grid by hand, a measured profile's round trip through its file, the
refit curve, shape/dtype matching, refused files, and the command's exit codes. Timings vary: only structure and
exact counts are asserted."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.cli.profile import store_codec
from kvcli.errors import BadInputError
from kvcli.model.calibration import BASE_POINTS
from kvcli.model.llama import build_model
from kvcli.model.presets import PRESETS
from kvcli.model.profile import (
    FORMAT,
    RATE_CHUNK_TOKENS,
    Profile,
    check_max_tokens,
    measure_profile,
    profile_points,
)
from kvcli.model.threads import torch_threads
from kvcli.store.serde import header_size

BASE = [("base", n, c) for n, c in BASE_POINTS]


def test_points_by_hand():
    assert profile_points(4096) == BASE + [
        ("full", 2048, 0), ("full", 4096, 0), ("thin", 64, 4032), ("half", 1024, 1024), ("half", 2048, 2048)]
    assert profile_points(1024) == BASE  # the ladders start above 1,024
    assert profile_points(512) == [("base", 32, 0), ("base", 128, 0), ("base", 512, 0), ("base", 256, 256)]
    # 3,000: the ladders stop at the last point of at most 3,000 tokens (no 4,096 full, thin or 2,048 + 2,048 half)
    assert profile_points(3000) == BASE + [("full", 2048, 0), ("half", 1024, 1024)]
    assert profile_points(8192)[len(BASE):] == [
        ("full", 2048, 0), ("full", 4096, 0), ("full", 8192, 0), ("thin", 64, 4032),
        ("half", 1024, 1024), ("half", 2048, 2048), ("half", 4096, 4096)]
    assert len(profile_points(32768)) == 7 + 5 + 2 + 5  # full and half 2k..32k; thin 4k, 16k
    assert [p for p in profile_points(131072) if p[0] == "thin"] == [
        ("thin", 64, 4032), ("thin", 64, 16320), ("thin", 64, 65472)]


@pytest.mark.parametrize("bad", [0, 511, -1])
def test_max_tokens_below_the_smallest_grid_is_refused(bad):
    with pytest.raises(BadInputError, match="--max-tokens must be at least 512"):
        check_max_tokens(bad)


def test_preset_contexts():
    assert {name: c.context for name, c in PRESETS.items()} == {
        "tiny": 8192, "cpu": 8192, "qwen2.5-0.5b": 32768, "llama-3.2-1b": 131072, "llama-3-8b": 8192}


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", "float32", "cpu", seed=0)


@pytest.fixture(scope="module")
def measured(tiny):
    calls = []
    with torch_threads(1):
        profile = measure_profile(tiny, 1024, repeats=2, codec=store_codec(), max_past_bytes=700 * 1024,
                                  progress=lambda *a: calls.append(a))
    return profile, calls


def test_measured_profile_has_every_point_and_repeat(measured, tiny):
    profile, calls = measured
    # tiny: 1,024 KV bytes per token in fp32, so 700 KiB of prefix KV holds 700 cached tokens: 64 after 960 is out
    assert [(p.kind, p.new_tokens, p.cached_tokens) for p in profile.points] == BASE[:-1]
    assert [(s.kind, s.new_tokens, s.cached_tokens) for s in profile.skipped] == [("base", 64, 960)]
    assert "prefix KV of 960 tokens" in profile.skipped[0].reason
    assert all(len(p.seconds) == 2 and min(p.seconds) > 0 for p in profile.points)
    assert (profile.format, profile.clock, profile.model, profile.dtype) == (FORMAT, "thread_time", "tiny", "float32")
    assert (profile.model_id, profile.shapes, profile.max_tokens, profile.repeats) == (
        tiny.model_id, PRESETS["tiny"], 1024, 2)
    assert profile.device["type"] == "cpu" and profile.device["torch_threads"] == 1
    assert profile.longest_full_tokens == 1024 == profile.curve().longest_full_tokens
    assert [t.chunk_tokens for t in profile.kv_timings] == list(RATE_CHUNK_TOKENS)
    assert [t.kv_bytes for t in profile.kv_timings] == [64 * 1024, 256 * 1024, 1024 * 1024]
    assert all(t.value_bytes > t.kv_bytes and len(t.load_seconds) == len(t.save_seconds) == 2
               for t in profile.kv_timings)
    largest = profile.kv_timings[-1]
    assert profile.load_bytes_per_second == largest.value_bytes / min(largest.load_seconds)
    assert profile.save_bytes_per_second == largest.value_bytes / min(largest.save_seconds)
    prefill = [c for c in calls if c[0] == "prefill"]
    assert [c[1:3] for c in prefill] == [(i, 12) for i in range(12)] + [(12, 12)]  # 6 points x 2, then the end
    assert [c[1:3] for c in calls if c[0] == "kv"] == [(i, 6) for i in range(6)] + [(6, 6)]


def test_profile_round_trips_and_refits_the_same_curve(measured, tmp_path):
    profile, _ = measured
    path = tmp_path / "p.json"
    profile.save(path)
    loaded = Profile.load(path)
    assert loaded == profile
    assert {f.name: getattr(loaded, f.name) for f in dataclasses.fields(Profile)} == \
        {f.name: getattr(profile, f.name) for f in dataclasses.fields(Profile)}
    curve, fitted = loaded.curve(), profile.curve()
    assert (curve.a, curve.b, curve.d, curve.e) == (fitted.a, fitted.b, fitted.d, fitted.e)
    assert curve.points_data == fitted.points_data and curve.to_dict() == profile.fit
    doc = json.loads(path.read_text())
    assert list(doc)[:5] == ["schema_version", "command", "provenance", "format", "kvcli_version"]
    assert doc["kv_rates"]["load_bytes_per_second"] == profile.load_bytes_per_second


def test_matches_names_what_differs(measured):
    profile, _ = measured
    assert profile.matches(PRESETS["tiny"], "float32") == ""
    assert profile.matches(PRESETS["tiny"], torch.float32) == ""
    assert profile.matches(dataclasses.replace(PRESETS["tiny"], name="other", context=4096), "fp32") == ""
    dtype = profile.matches(PRESETS["tiny"], "bf16")
    assert dtype == ("the profile was measured with --model tiny --dtype fp32 (kvcli/tiny@seed0:fp32), which "
                     "differs in dtype fp32 (here bf16)")
    other = profile.matches(PRESETS["llama-3-8b"], "bfloat16")
    assert other.startswith("the profile was measured with --model tiny --dtype fp32")
    assert "layers 2 (here 32)" in other and "head_dim 32 (here 128)" in other and "dtype fp32 (here bf16)" in other
    assert "\n" not in other


def _doc(profile: Profile) -> dict:
    return json.loads(profile.to_json())


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(format="kvcli-profile/2"), "profile format kvcli-profile/2 is newer than this kvcli"),
    (lambda d: d.update(format="something-else/1"), "not a kvcli profile: format 'something-else/1'"),
    (lambda d: d.pop("format"), "not a kvcli profile: no \"format\" field (this is kvcli profile's JSON)"),
    (lambda d: d.pop("points"), "missing field points"),
    (lambda d: d["model"]["shapes"].pop("layers"), "missing field model.shapes.layers"),
    (lambda d: d["device"].update(memory_bytes="lots"), "field device.memory_bytes: expected an integer, got a "
                                                        "string"),
    (lambda d: d["points"][0].update(seconds=[True]), "field points[0].seconds[0]: expected a number"),
    (lambda d: d["points"][0].update(new_tokens=0), "field points[0]: needs new_tokens >= 1"),
    (lambda d: d.update(points=[]), "field points: no timed point"),
    (lambda d: d["model"].update(dtype="int4"), "field model.dtype: unknown dtype 'int4'"),
    (lambda d: d.update(points=[d["points"][0]] * 4), "field points: 1 distinct (new, cached) token pair that does "
                                                      "not determine the cost curve's 4 coefficients"),
    (lambda d: d.update(points=[p for p in d["points"] if p["cached_tokens"] == 0]), "field points: 4 distinct (new, "
                                                                                     "cached) token pairs that do not"),
])
def test_load_refuses_a_bad_document_naming_the_file(measured, tmp_path, edit, message):
    doc = _doc(measured[0])
    edit(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInputError, match=re.escape(message)) as exc:
        Profile.load(path)
    assert str(exc.value).startswith(f"{path}: ") and "\n" not in str(exc.value)


def test_load_refuses_a_truncated_file_and_other_json(measured, tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(measured[0].to_json()[:500])
    with pytest.raises(BadInputError, match=rf"^{path}: not a kvcli profile: invalid JSON at line \d+ column \d+"):
        Profile.load(path)
    path.write_text(json.dumps({"schema_version": 1, "command": "replay", "traces": []}))
    with pytest.raises(BadInputError, match=r"no \"format\" field \(this is kvcli replay's JSON\)"):
        Profile.load(path)
    path.write_text("[1, 2]")
    with pytest.raises(BadInputError, match="not a kvcli profile: the document is a list"):
        Profile.load(path)
    with pytest.raises(BadInputError, match=f"^{tmp_path / 'none.json'}: cannot read the profile"):
        Profile.load(tmp_path / "none.json")


def test_default_max_tokens_is_the_models_context():
    model = build_model("tiny", "float32", "cpu", seed=0)
    model.config = dataclasses.replace(model.config, context=600)
    profile = measure_profile(model, repeats=1, codec=store_codec())
    assert profile.max_tokens == 600 and profile.shapes.context == 600
    assert [(p.kind, p.new_tokens, p.cached_tokens) for p in profile.points] == profile_points(600)
    assert profile.max_past_bytes > 0 and profile.skipped == ()


def test_cli_writes_a_profile_it_loads(tmp_path):
    out = tmp_path / "tiny.json"
    res = CliRunner().invoke(app, ["profile", "--model", "tiny", "--device", "cpu", "--max-tokens", "512",
                                   "--repeats", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    profile = Profile.load(out)
    assert [(p.new_tokens, p.cached_tokens) for p in profile.points] == [(32, 0), (128, 0), (512, 0), (256, 256)]
    assert profile.repeats == 2 and profile.max_tokens == 512
    assert res.stderr.splitlines() == ["profile: timing 4 points x 2 repeats on cpu "
                                       f"({profile.device['name']}) ...",
                                       "profile: load/save rates of 64, 256 and 1024-token chunks ...",
                                       f"profile: written {out}"]
    assert "fit: t = a + b*n" in res.stdout and "KV payload: load" in res.stdout


def test_cli_json_is_the_profile_document(tmp_path):
    out = tmp_path / "tiny.json"
    res = CliRunner().invoke(app, ["profile", "--model", "tiny", "--device", "cpu", "--max-tokens", "512",
                                   "--repeats", "1", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == json.loads(out.read_text())
    assert json.loads(res.stdout)["format"] == FORMAT


@pytest.mark.parametrize("args, message", [
    (["--max-tokens", "0"], "--max-tokens must be at least 512"),
    (["--max-tokens", str(10**12)], "--max-tokens must be at most 4,194,304 tokens (a prefill longer than any "
                                    "model's context), got 1,000,000,000,000"),
    (["--max-tokens", "8193"], "--max-tokens must be at most the model's context, 8,192 tokens, got 8,193"),
    (["--repeats", "0"], "--repeats must be an integer in [1, 100], got 0"),
    (["--repeats", "101"], "--repeats must be an integer in [1, 100], got 101"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--out", "{tmp}/missing/p.json"], "--out {tmp}/missing/p.json: no folder {tmp}/missing to write it in"),
    (["--out", "{tmp}"], "--out {tmp} is a directory"),
    (["--kv-dtype", "int8"], "--kv-dtype must be auto or fp8"),
])
def test_cli_bad_input_exits_2_before_any_timing(tmp_path, monkeypatch, args, message):
    def never(*a, **k):
        raise AssertionError("measured")

    monkeypatch.setattr("kvcli.model.profile.measure_profile", never)
    monkeypatch.setattr("kvcli.model.load.load_model", never)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    base = ["profile", "--model", "tiny", "--device", "cpu"] + ([] if "--max-tokens" in args else ["--max-tokens",
                                                                                                    "512"])
    res = CliRunner().invoke(app, base + (args if "--out" in args else args + ["--out", str(tmp_path / "p.json")]))
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("kvcli: error: " + message.replace("{tmp}", str(tmp_path)))
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


def test_a_checkpoint_profile_names_its_folder_and_context(tiny_checkpoint, tmp_path):
    from kvcli.model.checkpoint import read_checkpoint
    from kvcli.model.load import load_model

    model = load_model(tiny_checkpoint, device="cpu")
    shapes = read_checkpoint(tiny_checkpoint).shapes
    assert shapes.context == 131072  # config.json's max_position_embeddings
    profile = measure_profile(model, 512, repeats=1, codec=store_codec())
    assert (profile.model, profile.shapes, profile.model_id) == (read_checkpoint(tiny_checkpoint).path, shapes,
                                                                 model.model_id)
    assert len(profile.points) == 4 and profile.matches(shapes, "float32") == ""
    profile.save(tmp_path / "c.json")
    assert Profile.load(tmp_path / "c.json") == profile


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_on_cuda_without_one_exits_4_in_one_line(tmp_path):
    res = CliRunner().invoke(app, ["profile", "--model", "tiny", "--device", "cuda", "--out", str(tmp_path / "p")])
    assert res.exit_code == 4 and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith("kvcli: error: device 'cuda' cannot be used here")


# ---- --kv-dtype fp8: the payloads timed are fp8 ----

@pytest.fixture(scope="module")
def measured_fp8(tiny):
    with torch_threads(1):
        return measure_profile(tiny, 512, repeats=1, codec=store_codec("float8_e4m3fn"), max_past_bytes=700 * 1024)


def test_an_fp8_profile_times_one_byte_payloads(measured_fp8, measured, tmp_path):
    """tiny: 2 layers x 2 x 2 KV heads x 32 = 256 KV elements per token: 1,024 bytes in fp32, 256 in fp8. A
    value holds its header, the fp8 KV and 2 x 2 float32 scales (16 bytes)."""
    fp8, auto = measured_fp8, measured[0]
    assert (fp8.kv_dtype, fp8.kv_bytes_per_token, auto.kv_dtype, auto.kv_bytes_per_token) == (
        "float8_e4m3fn", 256, None, 1024)
    assert [t.kv_bytes for t in fp8.kv_timings] == [t.kv_bytes for t in auto.kv_timings]  # the model's tensor
    assert [t.value_bytes for t in fp8.kv_timings] == [
        header_size((2, 2, 2, t, 32), "float8_e4m3fn") + t * 256 + 16 for t in RATE_CHUNK_TOKENS]
    fp8.save(tmp_path / "fp8.json")
    doc = json.loads((tmp_path / "fp8.json").read_text())
    assert (doc["kv_rates"]["kv_dtype"], doc["kv_rates"]["kv_bytes_per_token"]) == ("float8_e4m3fn", 256)
    assert Profile.load(tmp_path / "fp8.json") == fp8
    # a replay prices with it only with the same --kv-dtype
    assert fp8.matches(PRESETS["tiny"], "float32", "float8_e4m3fn") == ""
    assert fp8.matches(PRESETS["tiny"], "float32") == (
        "the profile was measured with --model tiny --dtype fp32 --kv-dtype fp8 (kvcli/tiny@seed0:fp32), which "
        "differs in --kv-dtype fp8 (here auto)")
    assert auto.matches(PRESETS["tiny"], "float32", "float8_e4m3fn").endswith("differs in --kv-dtype auto (here fp8)")


def test_a_profile_with_an_unknown_kv_dtype_is_refused(measured_fp8, tmp_path):
    doc = _doc(measured_fp8)
    doc["kv_rates"]["kv_dtype"] = "int8"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInputError, match=re.escape("field kv_rates.kv_dtype: expected null or float8_e4m3fn, "
                                                      "got 'int8'")):
        Profile.load(path)


def test_cli_kv_dtype_fp8_reports_fp8_payloads(tmp_path):
    out = tmp_path / "fp8.json"
    res = CliRunner().invoke(app, ["profile", "--model", "tiny", "--device", "cpu", "--max-tokens", "512",
                                   "--repeats", "1", "--kv-dtype", "fp8", "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert Profile.load(out).kv_dtype == "float8_e4m3fn"
    assert "profile: load/save rates of 64, 256 and 1024-token chunks of fp8 payloads ..." in res.stderr.splitlines()
    assert "KV 256 bytes/token in fp8 (float8_e4m3fn)" in res.stdout
    # replay refuses it for payloads in the model's dtype, in one line naming the file
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"token_ids": list(range(1, 300))}) + "\n")
    replay = CliRunner().invoke(app, ["replay", str(trace), "--model", "tiny", "--prefill-profile", str(out),
                                      "--payload", "accounted", "--measure", "0"])
    errors = [line for line in replay.stderr.splitlines() if line.startswith("kvcli: error: ")]
    assert replay.exit_code == 2 and len(errors) == 1 and "Traceback" not in replay.output, replay.output
    assert errors[0].endswith("differs in --kv-dtype fp8 (here auto)") and str(out) in errors[0]


def test_a_profile_is_saved_through_a_fifo_and_a_symlink_leaving_both(measured, tmp_path):
    """--out's file rules (kvcli.outfile): a FIFO is written in place and stays a FIFO; a symbolic link stays a link
    and its target gets the profile."""
    import os
    import stat

    from test_outfile import read_fifo

    profile = measured[0]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    thread, got = read_fifo(fifo)
    text = profile.save(fifo)
    thread.join(10)
    assert got == [(text + "\n").encode()] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    (tmp_path / "t.json").write_text("old")
    (tmp_path / "link.json").symlink_to(tmp_path / "t.json")
    profile.save(tmp_path / "link.json")
    assert os.path.islink(tmp_path / "link.json") and Profile.load(tmp_path / "t.json") == profile
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.json", "t.json"]


def test_a_profile_of_copies_of_one_point_is_refused_by_replay(measured, tmp_path):
    doc = _doc(measured[0])
    doc["points"] = [doc["points"][0]] * 4
    path = tmp_path / "same.json"
    path.write_text(json.dumps(doc))
    out = CliRunner().invoke(app, ["replay", "sample_traces/tokens_small.jsonl", "--model", "tiny",
                                   "--prefill-profile", str(path), "--measure", "0"])
    assert out.exit_code == 2, out.output
    (line,) = [line for line in out.stderr.splitlines() if "error" in line]
    assert line.startswith(f"kvcli: error: {path}: field points: 1 distinct (new, cached) token pair that does not")
