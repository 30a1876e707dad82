"""A replayed trace's notes: the warnings a reader of its report needs, worded from the run's options, its per chunk
size records and a few plain figures (:func:`replay_notes`). Reads nothing and changes nothing: what the notes
need from the server (what a read namespace holds) comes in as a record.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvcli.model.hybridblock import VLLM_VERSION as HYBRID_RULE_VERSION
from kvcli.replay.network import PRICED_LINK
from kvcli.replay.savings import sig
from kvcli.store.namespace import absent_note

if TYPE_CHECKING:
    from kvcli.replay.results import ChunkSizeResult, ReplayConfig
    from kvcli.store.namespace import SizeContents


def namespace_misses(results: Sequence[ChunkSizeResult]) -> list[int]:
    """The chunk sizes of ``results`` whose requests took no chunk from the read namespace (``--namespace``)."""
    return [r.chunk_size for r in results if r.requests and not r.namespace_hit_chunks]


def hybrid_note(blocks: dict[int, int], lengths: np.ndarray) -> str | None:
    """The note of a replay of a hybrid model, else None (``blocks`` empty): the attention block vLLM gives it at
    each chunk size taken as its ``--block-size`` (``blocks``: chunk size -> tokens,
    :func:`kvcli.model.hybridblock.vllm_attention_block`), that its align mode resumes only at those blocks'
    boundaries (kvcli's store keeps a state with every chunk, so the hit tokens here do not lose that), and the
    requests of ``lengths`` (prompt tokens ``[requests]``) no larger than the smallest such block, which never
    resume on vLLM."""
    if not blocks:
        return None
    sizes = sorted(set(blocks.values()))
    block = sizes[0]
    said = (f"{block:,} tokens" if len(sizes) == 1 else
            ", ".join(f"{b:,} tokens at --block-size {cs}" for cs, b in sorted(blocks.items())))
    short = int(np.count_nonzero(lengths <= block))
    return (f"a hybrid model: vLLM {HYBRID_RULE_VERSION} enlarges its attention block to {said} (an attention page "
            "holds a Mamba state) and, in its default align mode, resumes a request only at such a block's boundary "
            "where an earlier request left a state; these hit tokens assume a resume at any chunk boundary, as "
            "kvcli's store keeps a state with every chunk (kvcli explain --model with --chunk-size gives what vLLM "
            f"loses as hybrid_block); {short:,} of {len(lengths):,} requests have at most {block:,} prompt tokens "
            "and never resume on vLLM")


def replay_notes(config: ReplayConfig, results: Sequence[ChunkSizeResult], span_seconds: float | None,
                 lengths: np.ndarray, measured: set[int], measure_tokens: int, curve_check: dict,
                 longest_full_tokens: int, model_id: str,
                 namespace_contents: dict[int, SizeContents] | None = None) -> list[str]:
    """Warnings a reader of the report needs, one line each, in this order: a network priced by assumption; no
    curve with a read namespace; per chunk size, pipelined lookups, prompts shorter than one chunk, chunks that
    failed their checksum, hit figures that are a lower bound (the run's own chunks vanished from the server, or
    Redis calls failed: :attr:`~kvcli.replay.results.ChunkSizeResult.understated`); a read namespace that gave
    nothing; measured prefills far from the cost curve; savings beyond the calibrated range; truncated
    measurements; background stores a trace's span cannot absorb.

    Args:
        config: the replay's options.
        results: the main layout's record of each chunk size (its savings and overheads already set).
        span_seconds: the trace's span, first to last arrival (None: unknown).
        lengths: prompt lengths ``[requests]`` in tokens, file order. measured: indices of the measured requests.
        measure_tokens: the most tokens of a measured prompt that ran the model.
        curve_check: :func:`kvcli.replay.measure.curve_check` of the trace's measured prefills
            (``median_measured_over_predicted``, ``samples``).
        longest_full_tokens: the cost curve's longest calibrated full prefill, tokens.
        model_id: the model the read namespace was searched for.
        namespace_contents: what the read namespace holds per chunk size
            (:func:`kvcli.store.namespace.contents`), read when :func:`namespace_misses` names a chunk size; None:
            not read (then no note about it).
    """
    notes = _option_notes(config)
    for res in results:
        notes += _size_notes(config, res)
    if namespace_contents is not None and config.namespace:
        notes += [absent_note(namespace_contents, config.namespace, model_id, size)
                  for size in namespace_misses(results)]
    ratio = None if config.priced else curve_check.get("median_measured_over_predicted")  # another machine's
    if ratio is not None and not 0.5 <= ratio <= 2.0:
        notes.append(f"measured prefills took {ratio:.2f}x what the cost curve predicts (median of "
                     f"{curve_check['samples']}): the machine was busy or the curve is off; estimates are unreliable")
    beyond = max((r.savings.beyond_share or 0.0 for r in results if r.savings), default=0.0)
    if beyond > 0:
        notes.append(f"up to {100 * beyond:.3g}% of a chunk size's saving comes from prompts longer than the "
                     f"longest calibrated full prefill ({longest_full_tokens:,} tokens; prompts reach "
                     f"{int(lengths.max()):,}): extrapolated, with the calibration's spread in its interval")
    longer = sum(1 for i in measured if lengths[i] > measure_tokens)
    if longer:
        notes.append(f"{longer} of {len(measured)} measured requests ran their first {measure_tokens:,} tokens "
                     f"(the measuring budget's length); the rest of each prompt is estimated")
    for r in results:
        if r.overheads and span_seconds and r.overheads.background > span_seconds:
            notes.append(f"chunk size {r.chunk_size}: background stores take {sig(r.overheads.background)} s "
                         f"over a trace of {sig(span_seconds)} s: asynchronous storing cannot keep up, "
                         f"so its synchronous net benefit is the one compared")
    return notes


def _option_notes(config: ReplayConfig) -> list[str]:
    """What the options leave to an assumption or switch off."""
    notes = []
    if config.priced and (config.link_gbps is None or config.rtt_seconds is None):
        notes.append(f"the Redis side is priced across a {PRICED_LINK.gbps:g} Gbit/s network with a "
                     f"{PRICED_LINK.rtt_seconds * 1e3:g} ms round trip where --link-gbps / --rtt-ms do not say "
                     f"(an assumption, not a measurement: give your network's)")
    if config.hit_curve and config.namespace is not None:
        notes.append("no capacity/TTL curve with --namespace: the curve models the run's own cold cache")
    return notes


def _size_notes(config: ReplayConfig, res: ChunkSizeResult) -> list[str]:
    """One chunk size's: lookups pipelined (where their latency was timed), prompts shorter than one chunk, chunks
    that failed their checksum, hit figures that are a lower bound (own chunks vanished, Redis calls failed)."""
    notes = []
    if res.lookups_sampled and not config.priced:  # a priced replay's lookups are counted, not timed
        notes.append(f"chunk size {res.chunk_size}: {res.lookups_pipelined:,} lookups pipelined, up to "
                     f"{config.pipeline} requests per batch (--pipeline: {res.lookup_round_trips:,} "
                     f"batch{'es' if res.lookup_round_trips != 1 else ''}); lookup p50/p99 and each lookup's "
                     f"latency come from {res.lookups_sampled:,} sampled unpipelined lookup"
                     f"{'s' if res.lookups_sampled != 1 else ''}")
    if res.short_requests:
        notes.append(f"chunk size {res.chunk_size}: {res.short_requests:,} of {res.requests:,} prompts "
                     f"({res.short_prompt_tokens:,} tokens) are shorter than one chunk: they can never hit")
    if res.checksum_failures:
        notes.append(f"chunk size {res.chunk_size}: {res.checksum_failures:,} chunks failed their checksum "
                     f"({res.checksum_verified_chunks:,} verified): counted as misses")
    if res.understated:
        notes.append(f"chunk size {res.chunk_size}: its hit figures, and the savings built on them, are a lower "
                     f"bound: {res.understated}")
    return notes
