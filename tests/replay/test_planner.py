"""The planner through ``kvcli replay`` on a real Redis: tiers, the optimal bound and the bill by hand, the curve's
points and plot with the optimal eviction, and bad planner options refused in one line. The simulations themselves,
without a server: tests/sim/test_tiers.py, test_optimal.py, test_eviction.py."""
from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.replay import curvereport
from kvcli.route.simulator import RouteTier, SimConfig


def _cli(tmp_path, *args):
    """``kvcli replay`` of the smallest trace where the LRU order matters at chunk size 4 (SMALLEST of
    test_curve_replay.py), index only, with ``args``."""
    path = tmp_path / "smallest.jsonl"
    prompts = [list(range(1, 17)), list(range(101, 105)), list(range(1, 17))]
    path.write_text("".join(json.dumps({"token_ids": p, "timestamp": t}) + "\n" for p, t in zip(prompts, [0, 1, 2])))
    return CliRunner().invoke(app, ["replay", str(path), "--chunk-sizes", "4", "--measure", "0", "--prefill-tps",
                                    "1000", "--payload", "accounted", "--model", "tiny", *map(str, args)])


def test_cli_tiers_optimal_and_bill_by_hand(tmp_path, redis_url):
    out = _cli(tmp_path, "--redis-url", redis_url, "--json", "--tier", "gpu=8", "--tier", "host=16KiB", "--optimal",
               "--price", "gpu-hour=3600", "--price", "host=1")
    assert out.exit_code == 0, out.output
    plan = json.loads(out.stdout)["traces"][0]["per_chunk_size"][0]["plan"]
    gpu, host = plan["tiers"]
    # r1 [a1..a4]: gpu keeps a1,a2, host all 4; r2 [b]: gpu {a1,b}, host {a3,a2,a1,b}; r3: gpu a1, host a2,a3
    assert (gpu["capacity_chunks"], host["capacity_chunks"]) == (2, 4)  # 8 tokens; 16 KiB / 4,096 bytes a chunk
    assert (gpu["hit_tokens"], host["hit_tokens"], plan["tier_hit_tokens"]) == (4, 8, 12)
    assert (gpu["bytes_read"], host["bytes_read"]) == (4096, 8192)
    assert (gpu["bytes_written"], host["bytes_written"]) == ((4 + 1 + 3) * 4096, (4 + 1 + 1) * 4096)
    assert gpu["load_seconds"] == 0.0
    # at the gpu's 2 chunks: LRU 4 tokens (the curve), MIN keeps a1,a2 past b: 8; unlimited 15
    assert plan["gap"] == {"capacity_chunks": 2, "lru_hit_tokens": 4, "optimal_hit_tokens": 8,
                           "unlimited_hit_tokens": 15, "policy_gap_tokens": 4, "capacity_gap_tokens": 7}
    # 12 tier hit tokens x (saved prefill 0.015 s / 15 hit tokens) over a 2 s span, at $3,600 an hour
    assert plan["bill"]["saved_usd_per_day"]["value"] == pytest.approx(0.012 * 86400 / 2)
    assert plan["bill"]["memory_usd_per_day"] == {"host": pytest.approx(16384 / 1e9 / (365.25 / 12))}
    assert plan["bill"]["accelerators_freed"]["value"] == pytest.approx(0.012 / 2)
    table = _cli(tmp_path, "--redis-url", redis_url, "--tier", "gpu=8", "--tier", "host=16KiB", "--optimal",
                 "--admit-after", "2", "--price", "gpu-hour=3600", "--full")  # the planner's rows: every row
    assert table.exit_code == 0, table.output
    assert "tier host (16.0 KiB): hit tokens" in table.stdout and "bill: saved $/day = " in table.stdout
    assert "admit after 2: bytes written (always)" in table.stdout
    compact = _cli(tmp_path, "--redis-url", redis_url, "--tier", "gpu=8", "--price", "gpu-hour=3600")
    assert compact.exit_code == 0 and "tier gpu" not in compact.stdout
    assert "Every row, the capacity planner's too: --full." in " ".join(compact.stdout.split())
    # the answer prices the saving: 0.015 s over a 2 s span at $3,600 an hour
    assert f"${0.015 * 86400 / 2:,.0f}/day at $3600/GPU-hour" in compact.stdout


@pytest.mark.parametrize("args, message", [
    (["--tier", "gpu"], "--tier must be NAME=SIZE"),
    (["--tier", "gpu=1", "--tier", "gpu=2"], "--tier names must differ"),
    (["--tier", "redis=16", "--tier", "gpu=8"], "--tier gpu: a per-node tier must come before the shared ones (redis)"),
    (["--tier", "gpu=8", "--tier", "redis=16", "--tier", "host=8"], "--tier host: a per-node tier must come before"),
    (["--tier", "gpu=64G"], "--tier gpu: capacity '64G' is ambiguous"),
    (["--tier", "gpu=8", "--no-curve"], "need the curve"),
    (["--admit-after", "0"], "--admit-after must be a count >= 1"),
    (["--price", "host=1"], "--price host: no --tier of that name"),
    (["--price", "gpu-hour=x"], "--price must be gpu-hour"),
    (["--policy", "arc"], "--policy: unknown policy arc"),
    (["--tier", "gpu=3"], "--tier gpu must be at least one chunk (>= --chunk-size, 4 tokens), got 3"),
])
def test_cli_refuses_bad_planner_options_in_one_line(tmp_path, args, message):
    out = _cli(tmp_path, *args)
    assert out.exit_code == 2 and message in out.output and "Traceback" not in out.output, out.output


def test_policies_without_libcachesim_are_refused_before_any_work(tmp_path, redis_url, monkeypatch):
    monkeypatch.setitem(sys.modules, "libcachesim", None)  # an import of it raises ImportError
    out = _cli(tmp_path, "--redis-url", redis_url, "--policy", "lfu")
    assert out.exit_code == 2 and "--policy needs libCacheSim: pip install 'kvcli[policies]'" in out.stderr
    assert "replaying" not in out.stderr and "trace 1 of 1" not in out.stderr and out.stdout == ""


def test_cli_curve_points_carry_the_optimal_hit_tokens(tmp_path, redis_url):
    # [a1..a4], [b], [a1..a4] at chunk 4: MIN bypasses b and keeps min(C, 4) of the a's; at 4 the whole prompt
    # of 16 tokens hits (15 reused). LRU loses the a's to b below 5 chunks.
    out = _cli(tmp_path, "--redis-url", redis_url, "--json", "--optimal")
    assert out.exit_code == 0, out.output
    points = json.loads(out.stdout)["traces"][0]["per_chunk_size"][0]["hit_curve"]["capacity_points"]
    assert [p["capacity_chunks"] for p in points] == [0, 1, 2, 3, 4, 5]
    assert [p["optimal_hit_tokens"] for p in points] == [0, 4, 8, 12, 15, 15]
    assert [p["hit_tokens"] for p in points] == [0, 0, 4, 8, 12, 15]
    plain = _cli(tmp_path, "--redis-url", redis_url, "--json")
    points = json.loads(plain.stdout)["traces"][0]["per_chunk_size"][0]["hit_curve"]["capacity_points"]
    assert all("optimal_hit_tokens" not in p for p in points)


def test_cli_plot_draws_lru_and_optimal(tmp_path, redis_url, monkeypatch):
    drawn = []

    def figure(*args):
        fig = curve_figure(*args)
        drawn.append({line.get_label(): list(map(float, line.get_ydata())) for line in fig.axes[0].get_lines()})
        return fig

    curve_figure = curvereport.curve_figure
    monkeypatch.setattr(curvereport, "curve_figure", figure)
    out = _cli(tmp_path, "--redis-url", redis_url, "--optimal", "--plot", tmp_path / "c.png")
    assert out.exit_code == 0, out.output
    (lines,) = drawn
    # capacities 1..5 chunks of the 36 prompt tokens: LRU hits 0, 1, 2, 3, 4 chunks of 4 tokens, MIN 1, 2, 3, 4, 4
    assert lines["chunk size 4"] == pytest.approx([100 * 4 * k / 36 for k in (0, 1, 2, 3, 4)])
    assert lines["chunk size 4: optimal eviction (MIN)"] == pytest.approx([100 * 4 * k / 36 for k in (1, 2, 3, 4, 4)])
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn.clear()
    assert _cli(tmp_path, "--redis-url", redis_url, "--plot", tmp_path / "d.png").exit_code == 0
    assert not any("optimal" in label for label in drawn[0])


def test_a_tier_smaller_than_one_chunk_is_refused_as_route_refuses_it(tmp_path, redis_url, redis_client):
    """A tier that holds no chunk (3 tokens at chunk size 4; 2 KiB where a chunk's KV is 4 KiB) could only report
    misses: refused in one line, as kvcli route refuses it (the one check, kvcli.sim.tiers.check_tier_room), the
    size in bytes before anything is written."""
    out = _cli(tmp_path, "--redis-url", redis_url, "--tier", "gpu=8", "--tier", "host=2KiB")
    assert out.exit_code == 2, out.output
    assert out.stderr.splitlines()[-1] == ("kvcli: error: --tier host must be at least one chunk (4,096 bytes of KV at "
                                           "chunk size 4), got 2,048 bytes")
    assert redis_client.dbsize() == 0
    with pytest.raises(BadInputError) as route:
        SimConfig(chunk_size=4, capacity_tokens=8, first_tier="gpu", lower_tiers=(RouteTier("host", 3, False),))
    assert str(route.value) == "--tier host must be at least one chunk (>= --chunk-size, 4 tokens), got 3"


@pytest.mark.parametrize("capacity, s3fifo", [(10, None), (20, 15)])
def test_cli_s3fifo_below_its_smallest_useful_capacity_is_not_run_and_said(tmp_path, redis_url, capacity, s3fifo):
    """SMALLEST with one tier of ``capacity`` chunks, which holds every chunk: r3 = r1 hits its 4 chunks, 15 tokens
    reused (its last one computed again), by LRU and LFU alike. At 10 chunks libCacheSim's S3-FIFO holds nothing:
    it is not run, and one line under the table says so; at 20 it holds everything, as LRU does."""
    args = ["--redis-url", redis_url, "--tier", f"gpu={4 * capacity}", "--policy", "lfu,s3fifo"]
    out = _cli(tmp_path, *args, "--json")
    assert out.exit_code == 0, out.output
    policies = {p["policy"]: p for p in json.loads(out.stdout)["traces"][0]["per_chunk_size"][0]["plan"]["policies"]}
    assert (policies["lru"]["hit_tokens"], policies["lfu"]["hit_tokens"]) == (15, 15)
    why = ("not run: S3-FIFO holds nothing below 20 chunks (libCacheSim's small FIFO, 10% of the cache, keeps "
           "nothing under 2)")
    table = _cli(tmp_path, *args, "--full")  # the planner's rows and notes
    assert table.exit_code == 0, table.output
    text = " ".join(table.stdout.split())  # the table's lines wrap
    if s3fifo is None:
        assert (policies["s3fifo"]["hit_tokens"], policies["s3fifo"]["skipped"]) == (0, why)
        assert f"chunk size 4: policy s3fifo at {capacity} chunks {why}" in text
    else:
        assert (policies["s3fifo"]["hit_tokens"], policies["s3fifo"]["skipped"]) == (s3fifo, "")
        assert "policy s3fifo at" not in text
