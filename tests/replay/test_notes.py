"""A replay's notes (kvcli/replay/notes.py) from plain records: each note's wording and their order."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kvcli.replay.notes import namespace_misses, replay_notes
from kvcli.replay.results import ChunkSizeResult, ReplayConfig


def size(chunk_size: int, **kw) -> ChunkSizeResult:
    return ChunkSizeResult(chunk_size=chunk_size, namespace="run", **kw)


def notes(config=None, results=(), span=None, lengths=(100,), measured=(), measure_tokens=2048, check=None,
          found=None) -> list[str]:
    return replay_notes(config or ReplayConfig(), list(results), span, np.array(lengths), set(measured),
                        measure_tokens, check or {"samples": 0}, 512, "kvcli/cpu@seed0:fp32", found)


def test_a_quiet_run_has_no_notes():
    assert notes(results=[size(16, requests=3)]) == []


def test_each_chunk_size_says_its_pipelining_short_prompts_and_checksums_in_that_order():
    res = size(64, requests=10, lookups_sampled=1, lookups_pipelined=1200, lookup_round_trips=1, short_requests=2,
               short_prompt_tokens=70, checksum_failures=3, checksum_verified_chunks=64)
    assert notes(ReplayConfig(pipeline=256), [res]) == [
        "chunk size 64: 1,200 lookups pipelined, up to 256 requests per batch (--pipeline: 1 batch); lookup "
        "p50/p99 and each lookup's latency come from 1 sampled unpipelined lookup",
        "chunk size 64: 2 of 10 prompts (70 tokens) are shorter than one chunk: they can never hit",
        "chunk size 64: 3 chunks failed their checksum (64 verified): counted as misses"]


def test_options_notes_come_first_and_the_estimates_last():
    config = ReplayConfig(priced=True, link_gbps=25.0, namespace="warm", payload="accounted", measure=0)
    res = size(16, requests=4, savings=SimpleNamespace(beyond_share=0.25),
               overheads=SimpleNamespace(background=30.0))
    assert notes(config, [res], span=10.0, lengths=(100, 4000), measured=(1,), measure_tokens=1024, found={}) == [
        "the Redis side is priced across a 100 Gbit/s network with a 0.1 ms round trip where --link-gbps / "
        "--rtt-ms do not say (an assumption, not a measurement: give your network's)",
        "no capacity/TTL curve with --namespace: the curve models the run's own cold cache",
        "namespace 'warm' holds nothing for model kvcli/cpu@seed0:fp32 at chunk size 16 (another --seed, --model, "
        "--dtype or chunk size, or a typo?); it holds: no kvcli keys",
        "up to 25% of a chunk size's saving comes from prompts longer than the longest calibrated full prefill "
        "(512 tokens; prompts reach 4,000): extrapolated, with the calibration's spread in its interval",
        "1 of 1 measured requests ran their first 1,024 tokens (the measuring budget's length); the rest of each "
        "prompt is estimated",
        "chunk size 16: background stores take 30.0 s over a trace of 10.0 s: asynchronous storing cannot keep up, "
        "so its synchronous net benefit is the one compared"]


def test_a_cost_curve_off_by_more_than_2x_is_said_unless_priced():
    check = {"median_measured_over_predicted": 2.5, "samples": 3}
    assert notes(check=check) == ["measured prefills took 2.50x what the cost curve predicts (median of 3): the "
                                  "machine was busy or the curve is off; estimates are unreliable"]
    assert notes(check={"median_measured_over_predicted": 1.9, "samples": 3}) == []
    assert notes(ReplayConfig(priced=True, link_gbps=1.0, rtt_seconds=0.001), check=check) == []


def test_namespace_misses_and_their_notes_need_what_the_namespace_holds():
    results = [size(16, requests=4, namespace_hit_chunks=2), size(64, requests=4), size(256)]
    assert namespace_misses(results) == [64]
    config = ReplayConfig(namespace="warm", hit_curve=False)
    assert notes(config, results) == []  # not read: nothing said
    assert [n[:48] for n in notes(config, results, found={})] == ["namespace 'warm' holds nothing for model kvcli/c"]
