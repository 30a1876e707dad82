"""kvcli.store.records: a store's running totals (StoreStats) change through their count_* methods only."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from kvcli.store.records import StoreStats

STORE = Path(__file__).resolve().parents[2] / "kvcli" / "store"
FIELDS = {f.name for f in dataclasses.fields(StoreStats)}


def test_each_count_adds_to_its_totals():
    st = StoreStats()
    st.count_round_trips(3)
    st.count_round_trips(-1)
    st.count_lookup(0.5, 1)
    st.count_lookup(0.25, 0)  # a prompt without a full chunk: no round trip
    st.count_pipelined_lookups(10)
    st.count_lookup_round_trips(1)
    st.count_sample(0.75)
    assert (st.round_trips, st.lookups, st.lookups_pipelined, st.lookup_round_trips, st.lookups_sampled) == (
        2, 12, 10, 2, 1)
    assert st.lookup_seconds == [0.5, 0.25, 0.75] and st.mean_lookup_seconds() == 0.5

    st.count_write(3, 6, 300, 30, 90, real=True)  # 3 chunks: payload and metadata keys
    st.count_write(2, 2, 200, 20, 60, real=False)  # accounted: metadata only, no header
    st.count_rewrite(100)  # one accounted chunk got its payload (its write counted above)
    assert (st.chunks_written, st.metadata_entries, st.objects_created) == (5, 5, 8)
    assert (st.payload_bytes_written, st.header_bytes_written, st.payload_bytes_accounted) == (300, 30, 100)
    assert st.metadata_bytes_written == 150

    st.count_read(64, 8)
    st.count_checksums(2, 1)
    st.count_evictions(4)
    st.count_faults(errors=1, timeouts=2)
    st.count_faults(retries=3, busy_retries=4)
    assert (st.payload_bytes_read, st.header_bytes_read, st.checksum_verified_chunks, st.checksum_failures) == (
        64, 8, 2, 1)
    assert (st.evicted_chunks, st.redis_errors, st.redis_timeouts, st.redis_retries, st.redis_busy_retries) == (
        4, 1, 2, 3, 4)


def changed_totals(source: str) -> list[str]:
    """Where ``source`` changes a :class:`StoreStats` field itself: ``x.field += ...`` (or ``-=``, ``=``) or
    ``x.lookup_seconds.append(...)``, on anything but ``self``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AugAssign) else []
        out += [f"{node.lineno}: {t.attr}" for t in targets if isinstance(t, ast.Attribute) and t.attr in FIELDS
                and not (isinstance(t.value, ast.Name) and t.value.id == "self")]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "lookup_seconds"):
            out.append(f"{node.lineno}: lookup_seconds.{node.func.attr}")
    return out


def test_no_module_of_the_store_changes_a_total_itself():
    bad = [f"{path.name}:{hit}" for path in sorted(STORE.glob("*.py")) if path.name != "records.py"
           for hit in changed_totals(path.read_text())]
    assert bad == []


def test_the_totals_check_can_fail():
    source = ("def f(st, store):\n    st.lookups += 1\n    store.stats.round_trips -= 1\n"
              "    st.lookup_seconds.append(1)\n")
    assert changed_totals(source) == ["2: lookups", "3: round_trips", "4: lookup_seconds.append"]
