"""One pricing for everything, the cache the figures assume, and how big it must be, through ``kvcli replay`` on a
real Redis: a flat --prefill-tps prices the overheads as --hardware does (nothing timed here reported), --hardware
sizes the per-node GPU tier and says so, --capacity unlimited / SIZE, the sizes for --sizing shares priced request
by request, and the Mooncake sample's verdict the same at the roofline's own rate."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.replay.network import PRICED_LINK
from kvcli.replay.results import TIMED_FIELDS

MOONCAKE = Path(__file__).resolve().parents[2] / "sample_traces" / "mooncake_conversation_head1000.jsonl.gz"
# two conversations whose turns resend their history, one timestamp a second
TRACE = "".join(json.dumps({"token_ids": list(range(base, base + n)), "timestamp": t}) + "\n"
                for t, (base, n) in enumerate([(1, 300), (5000, 200), (1, 500), (5000, 400), (1, 700), (5000, 600)]))


def _replay(tmp_path, redis_url, *args):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    out = CliRunner().invoke(app, ["replay", str(trace), "--payload", "accounted", "--chunk-sizes", "16,64",
                                   "--redis-url", redis_url, "--jobs", "1", *args])
    return out


def _doc(out) -> dict:
    assert out.exit_code == 0, out.output
    (t,) = json.loads(out.stdout)["traces"]
    return t


def test_a_flat_rate_prices_the_overheads_too_and_reports_nothing_timed(tmp_path, redis_url):
    t = _doc(_replay(tmp_path, redis_url, "--model", "tiny", "--prefill-tps", "1000", "--json"))
    assert t["measured_requests"] == 0  # --measure auto: nothing to time when prefill is priced
    assert t["pricing"]["mode"] == "priced" and t["pricing"]["prefill"] == "flat rate: --prefill-tps 1000"
    assert t["pricing"]["prefill_tokens_per_second"] == pytest.approx(1000)
    assert t["server_rates_per_chunk"] == {}
    for row in t["per_chunk_size"]:
        o = row["overheads"]
        assert o["timed"] is False and o["source"] == (
            "priced: network model 100 Gbit/s, 0.1 ms round trip; KV to and from the device at 64 GB/s: PCIe 5.0 "
            "x16 at its peak rate (assumed: no accelerator named)")
        assert o["lookup_seconds"] == pytest.approx(row["lookups"] * PRICED_LINK.rtt_seconds)
        assert all(row[k] is None for k in TIMED_FIELDS)
    again = _doc(_replay(tmp_path, redis_url, "--model", "tiny", "--prefill-tps", "1000", "--json"))
    assert [r["overheads"] for r in again["per_chunk_size"]] == [r["overheads"] for r in t["per_chunk_size"]]


def test_the_table_of_a_priced_replay_leaves_out_what_was_timed(tmp_path, redis_url):
    out = _replay(tmp_path, redis_url, "--model", "tiny", "--prefill-tps", "1000")
    assert out.exit_code == 0, out.output
    assert "timed here" not in out.stdout and "Priced, not timed" in out.stdout
    assert "  priced: prefill from the flat rate: --prefill-tps 1000; overheads priced: network model" in out.stdout


def test_a_replay_timed_here_labels_its_timings(tmp_path, redis_url):
    out = _replay(tmp_path, redis_url, "--model", "tiny", "--measure", "1", "--calibrate-seconds", "0.2",
                  "--measure-seconds", "0.2", "--chunk-sizes", "64", "--full")  # the timed rows: the full table
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())  # lines under the table wrap at the console's width
    assert "lookup p50 / p99, timed here" in out.stdout and "Timed here:" in text
    assert "timed here: prefill from measured in this run; overheads timed here: lookups" in text


def test_hardware_sizes_the_gpu_tier_and_says_so(tmp_path, redis_url):
    t = _doc(_replay(tmp_path, redis_url, "--model", "llama-3-8b", "--hardware", "h100-sxm", "--json"))
    cap = t["capacity"]
    assert cap["kind"] == "gpu tier" and cap["gpu_tier"]["kv_bytes"] == int(80 * 2 ** 30 * 0.9 - 16_060_522_496
                                                                             - 3 * 2 ** 30)
    for row in cap["per_chunk_size"]:  # 128 KiB of KV per token: whole chunks of the tier's bytes
        assert row["capacity_chunks"] == cap["gpu_tier"]["kv_bytes"] // (row["chunk_size"] * 131_072)
        assert row["unlimited_chunks"] == {16: 43 + 37, 64: 10 + 9}[row["chunk_size"]]  # the longest turns
    table = _replay(tmp_path, redis_url, "--model", "llama-3-8b", "--hardware", "h100-sxm")
    text = " ".join(table.stdout.split())  # lines under the table wrap at the console's width
    assert ("cache: GPU tier 54.0 GiB per node (NVIDIA H100 SXM5 80GB: 80.0 GiB x 0.9 - 15.0 GiB weights - 3.0 "
            "GiB runtime and activations) = 443k tokens; unbounded would need") in text
    assert "--prefill-tps" in text and "--capacity 58027663360B" in text


@pytest.mark.parametrize("args, kind, why", [
    (["--capacity", "unlimited"], "unlimited", "asked for with --capacity unlimited"),
    (["--capacity", "1M tokens"], "given", "--capacity-tokens / --capacity-bytes"),
    (["--capacity-bytes", "1GB"], "given", "--capacity-tokens / --capacity-bytes"),
])
def test_capacity_asked_for(tmp_path, redis_url, args, kind, why):
    t = _doc(_replay(tmp_path, redis_url, "--model", "llama-3-8b", "--hardware", "h100-sxm", "--json", *args))
    assert (t["capacity"]["kind"], t["capacity"]["why"], t["capacity"]["gpu_tier"]) == (kind, why, None)


def test_a_flat_rate_names_no_accelerator_so_the_cache_is_unlimited(tmp_path, redis_url):
    out = _replay(tmp_path, redis_url, "--model", "tiny", "--prefill-tps", "1000")
    assert out.exit_code == 0, out.output
    assert ("  cache: unlimited (no accelerator named to size a GPU tier on; --hardware NAME or --capacity SIZE "
            "sets one): ") in out.stdout


@pytest.mark.parametrize("args, message", [
    (["--capacity", "unlimited", "--capacity-bytes", "1GB"], "--capacity unlimited and a capacity"),
    (["--capacity", "64GiB", "--capacity-tokens", "5"], "--capacity SIZE and --capacity-tokens / --capacity-bytes"),
    (["--capacity", "64G"], "--capacity must be auto, unlimited or a size: cache: capacity '64G' is ambiguous"),
    (["--sizing", "0,0.5"], "--sizing takes shares of the unlimited hits in (0, 1]"),
    (["--sizing", "half"], "--sizing takes shares of the unlimited hits, e.g. 0.9,0.95,0.99"),
])
def test_bad_capacity_and_sizing_are_refused_in_one_line(tmp_path, redis_url, args, message):
    out = _replay(tmp_path, redis_url, "--model", "tiny", "--prefill-tps", "1000", *args)
    assert out.exit_code == 2 and message in out.stderr, out.output


def test_sizes_are_the_curve_s_and_priced_request_by_request(tmp_path, redis_url):
    """At 100% of the unlimited hits a size saves what the unlimited replay saved (the same requests' hits through
    the same cost), and its bill is that saving at the GPU-hour price over the trace's span."""
    t = _doc(_replay(tmp_path, redis_url, "--model", "llama-3-8b", "--hardware", "h100-sxm", "--capacity",
                     "unlimited", "--sizing", "0.5,1", "--price", "gpu-hour=2", "--json"))
    for row in t["per_chunk_size"]:
        half, whole = row["sizing"]
        points = row["hit_curve"]["capacity_for_fraction"]
        assert (half["fraction"], whole["fraction"]) == (0.5, 1.0)
        assert whole["capacity_chunks"] == points["1.0"]["capacity_chunks"]
        assert whole["hit_tokens"] == row["hit_tokens"] == row["hit_tokens_unlimited"]
        saved = row["savings"]["saved_prefill_seconds"]
        assert whole["saved_prefill_seconds"] == pytest.approx(
            {k: saved[f"{k}_seconds"] for k in ("value", "low", "high")}, rel=1e-9)
        assert 0 < half["saved_prefill_seconds"]["value"] < whole["saved_prefill_seconds"]["value"]
        assert half["hit_tokens"] >= row["hit_tokens_unlimited"] / 2
        assert whole["bill"]["saved_usd_per_day"]["value"] == pytest.approx(
            whole["saved_prefill_seconds"]["value"] * 86_400 / t["span_seconds"] / 3600 * 2)


def test_the_mooncake_verdict_is_the_same_at_the_roofline_s_own_rate(redis_url):
    """--hardware prints the flat rate (and the GPU tier) that give its total prefill: a --prefill-tps run at them
    prices the same overheads, and names the same chunk sizes."""
    base = ["replay", str(MOONCAKE), "--model", "llama-3-8b", "--limit", "400", "--chunk-sizes", "256,512,1024",
            "--redis-url", redis_url, "--json"]
    hardware = _doc(CliRunner().invoke(app, base + ["--hardware", "h100-sxm"]))
    rate = hardware["pricing"]["prefill_tokens_per_second"]
    tier = hardware["capacity"]["gpu_tier"]["kv_bytes"]
    flat = _doc(CliRunner().invoke(app, base + ["--prefill-tps", f"{rate:.0f}", "--capacity", f"{tier}B"]))
    assert flat["verdict"]["kind"] == hardware["verdict"]["kind"]
    assert flat["verdict"]["tied_chunk_sizes"] == hardware["verdict"]["tied_chunk_sizes"]
    assert flat["recommended_chunk_size"] == hardware["recommended_chunk_size"]
    assert [r["overheads"]["critical_path_seconds"] for r in flat["per_chunk_size"]] == pytest.approx(
        [r["overheads"]["critical_path_seconds"] for r in hardware["per_chunk_size"]])
