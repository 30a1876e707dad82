"""The replay report's compact table, from hand-made results (no server, no model): the rows that decide the answer,
one unit per row of seconds (its interval row in the same one), compact counts, and rows that appear only where
they say something."""
from __future__ import annotations

import pytest
from rich.console import Console

from kvcli.replay.network import Overheads
from kvcli.replay.report import compact_rows, compact_table
from kvcli.replay.results import ChunkSizeResult, TraceResult
from kvcli.replay.savings import Interval, Savings, recommend
from kvcli.units import fmt_count


def _row(cs: int, saved: Interval, critical: float = 0.01, **kw) -> ChunkSizeResult:
    net = Interval(saved.value - critical, saved.low - critical, saved.high - critical)
    savings = Savings(saved, 0.0, saved.value, Interval(4 * saved.value, 4 * saved.low, 4 * saved.high),
                      Interval(0.25, 0.24, 0.26), None, 0.0, 0.0, critical, 0.0, net, net)
    return ChunkSizeResult(cs, "ns", requests=10, prompt_tokens=1000, hit_tokens=500, hit_tokens_unlimited=500,
                           upper_bound_tokens=600, savings=savings,
                           overheads=Overheads(lookup=critical, transfer=0.0, deserialize=0.0, serialize_store=0.0,
                                               source="measured"), **kw)


def test_a_row_of_seconds_and_its_interval_share_one_unit():
    rows = [_row(16, Interval(9810.0, 7240.0, 11600.0), objects_created=683_082),
            _row(1024, Interval(0.5, 0.4, 0.6), objects_created=42)]
    result = TraceResult("t", 10, 0, 0, "accounted", rows,
                         verdict=recommend({r.chunk_size: r.savings.net_async for r in rows}))
    cells = compact_rows(result)
    assert [label for label, _ in cells] == [
        "hit token ratio", "  token-granular bound", "objects created", "KV payload bytes", "metadata bytes",
        "critical path", "prefill saved", "  95% interval", "  share of prefill", "net benefit (async)",
        "  95% interval"]
    got = dict(cells[:7])
    # 11,600 s is past 10,000 s: the saving's row and its interval in hours
    assert got["prefill saved"] == ["2.73 h", "1.39e-04 h"] and cells[7][1] == ["2.01–3.22", "1.11e-04–1.67e-04"]
    assert got["critical path"] == ["10.0 ms", "10.0 ms"] and got["objects created"] == ["683k", "42"]
    assert cells[10][1] == ["2.01–3.22", "1.08e-04–1.64e-04"]


def test_rows_that_say_something_only_where_they_do():
    evicting = _row(64, Interval(1.0, 0.9, 1.1), evicted_chunks=12_345, store_mode="sync")
    evicting.hit_tokens_unlimited = 700
    evicting.upper_bound_tokens = None  # --no-upper-bound
    labels = [label for label, _ in compact_rows(TraceResult("t", 10, 0, 0, "accounted", [evicting]))]
    assert "  unbounded cache" in labels and "  evicted chunks" in labels and "background (stores)" in labels
    assert "  token-granular bound" not in labels and "net benefit (sync)" in labels


def test_the_compact_table_fits_80_columns_with_four_sizes_side_by_side():
    rows = [_row(cs, Interval(9810.0, 7240.0, 11600.0), objects_created=683_082,
                 payload_bytes_accounted=82 * 2 ** 30, metadata_bytes_written=135 * 2 ** 20)
            for cs in (16, 64, 256, 1024)]
    result = TraceResult("t", 10, 0, 0, "accounted", rows,
                         verdict=recommend({r.chunk_size: r.savings.net_async for r in rows}))
    console = Console(width=80, record=True)
    console.print(compact_table(result))
    lines = console.export_text().splitlines()
    assert max(map(len, lines)) <= 80 and lines[0].split()[:2] == ["chunk", "size"]
    assert [w for w in lines[0].split()[2:] if w.isdigit()] == ["16", "64", "256", "1024"]


@pytest.mark.parametrize("n, text", [(0, "0"), (9_999, "9,999"), (10_000, "10.0k"), (42_224, "42.2k"),
                                     (683_082, "683k"), (999_500, "1.00M"), (1_234_567, "1.23M"),
                                     (-42_224, "-42.2k"), (None, "–")])
def test_fmt_count(n, text):
    assert fmt_count(n) == text
