"""What an engine cached beside what ``kvcli explain`` predicts, request by request, with a cause for every token
of difference.

Per request of ``n`` prompt tokens at the engine's block size ``B``: ``E``, the prompt tokens the engine reported
cached (:mod:`kvcli.engine.reports`); ``P``, explain's ``reused_tokens`` (:mod:`kvcli.analysis.explain`) at
chunk size ``B`` and the engine's capacity (:func:`capacity_tokens`). The difference ``E - P`` (tokens, signed:
> 0 when the engine cached more) is split into causes (:data:`CAUSES`), each signed likewise:

================== ===============================================================================================
cause              tokens
================== ===============================================================================================
whole_last_block   ``P' - P`` with ``P' = floor(P / B) * B``: a prompt of whole blocks held whole; vLLM's hit stops
                   at the last full block within ``n - 1`` tokens, so it computes the whole last block again
                   (explain's rule computes only the last token)
prompt_differs     all of ``E - P`` when the engine's prompt length is not the trace's (a chat template, a BOS)
evicted_by_engine  (with events) predicted-hit blocks the engine had stored and removed before the request arrived
                   (``evicted_by`` names the requests whose allocation removed them)
not_yet_stored     (with events) blocks stored only by a batch at or after the request's arrival
salt_or_extra_keys (with events) blocks never held under the request's salt, LoRA and extra keys, whose tokens
                   were held under others
never_stored       (with events) blocks no batch stored before the request arrived
kept_by_engine     (with events) blocks the engine still held that explain's capacity had evicted
================== ===============================================================================================

With events, the engine's own run ``R`` (its held blocks from block 0, within ``(n - 1) // B`` blocks:
:class:`kvcli.analysis.engine_cache.EngineCache`) sits between the two: ``P' - R`` goes to the cause of the first
block of the gap (the hit stops there), ``E - R`` is what the events do not account for. Without events, ``E - P'``
is. Either remainder is ``unexplained`` unless the prompt differs.

Requests join the engine's rows by id when every request's id is among the rows' ids, else by order (same count).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcli.analysis.engine_cache import BlockHistory, EngineCache
from kvcli.analysis.explain import ExplainConfig, Explainer
from kvcli.analysis.workload import each_trace, ordered_requests
from kvcli.engine.events import BlockStored, EventBatch
from kvcli.engine.reports import EngineReport, read_engine_log
from kvcli.errors import BadInputError
from kvcli.sim.scheduler import EngineConfig
from kvcli.traces.paths import as_given, display_name

#: the causes of a difference, in the order reports list them (module docstring).
CAUSES = ("whole_last_block", "evicted_by_engine", "not_yet_stored", "salt_or_extra_keys", "never_stored",
          "kept_by_engine", "prompt_differs")

#: blocks vLLM's pool holds no cached tokens in, at one request at a time: the null block, and the partial last
#: block of the previous request, freed to the front of the free queue and taken first.
RESERVED_BLOCKS = 2


def capacity_tokens(gpu_blocks: int | None, block_size: int) -> int | None:
    """explain's LRU capacity (tokens) standing for vLLM's pool of ``gpu_blocks`` blocks (None: unbounded):
    ``(gpu_blocks - 2) * block_size`` (:data:`RESERVED_BLOCKS`; matches every request of vLLM 0.32.0's recorded
    runs served one at a time, tests/engine/test_explain_vs_vllm.py). Several requests at once also pin the blocks
    of those running, which this does not count.

    Raises:
        BadInputError: ``gpu_blocks`` below 3 (no block would hold a cached token).
    """
    if gpu_blocks is None:
        return None
    if gpu_blocks <= RESERVED_BLOCKS:
        raise BadInputError(f"--gpu-blocks must be > {RESERVED_BLOCKS} (the null block and a request's partial "
                            f"block hold no cached tokens), got {gpu_blocks}")
    return (gpu_blocks - RESERVED_BLOCKS) * block_size


@dataclass
class AuditedRequest:
    """One request audited (module docstring; tokens).

    Attributes:
        id: the trace's id. engine_id: the engine row's id (None: it has none). prompt_tokens: ``n``.
        engine_prompt_tokens: the engine's count (None: not reported). engine_cached_tokens: ``E``.
        predicted_cached_tokens: ``P``. events_cached_tokens: ``R`` (None without events).
        causes: signed tokens per :data:`CAUSES` (only those not 0). unexplained_tokens: the signed rest.
        evicted_by: ids of the requests whose allocation evicted the first missing block.
    """

    id: str
    engine_id: str | None
    prompt_tokens: int
    engine_prompt_tokens: int | None
    engine_cached_tokens: int
    predicted_cached_tokens: int
    events_cached_tokens: int | None = None
    causes: dict[str, int] = field(default_factory=dict)
    unexplained_tokens: int = 0
    evicted_by: list[str] = field(default_factory=list)

    @property
    def difference_tokens(self) -> int:
        return self.engine_cached_tokens - self.predicted_cached_tokens


@dataclass
class Audit:
    """A trace audited: ``joined_by`` ("id" or "order"), the requests, and the batches that matched no request's
    blocks (``unplaced_batches``)."""

    name: str
    joined_by: str
    requests: list[AuditedRequest]
    unplaced_batches: int = 0
    media: dict[str, int] = field(default_factory=dict)

    @property
    def requests_exact(self) -> int:
        return sum(r.difference_tokens == 0 for r in self.requests)

    @property
    def unexplained_tokens(self) -> int:
        """Tokens of difference no cause accounts for, summed unsigned."""
        return sum(abs(r.unexplained_tokens) for r in self.requests)

    def causes(self) -> dict[str, int]:
        """Signed tokens per cause over the trace, largest magnitude first."""
        total: Counter[str] = Counter()
        for r in self.requests:
            total.update(r.causes)
        return dict(sorted(((c, t) for c, t in total.items() if t), key=lambda ct: (-abs(ct[1]), ct[0])))


def audit_trace(trace: Path, engine_log: Path, block_size: int, gpu_blocks: int | None = None,
                events: Path | None = None) -> Audit:
    """Audit one trace against the engine's log (and its KV events), module docstring.

    Raises:
        BadInputError: a bad trace, log or events file (``file:line``), a block size < 1, ``gpu_blocks`` < 3,
            rows that join the requests neither by id nor by order, an events file with no batch, or blocks stored
            at another block size than ``block_size``.
    """
    # with the engine's pool, explain runs vLLM's own block accounting (kvcli.sim.scheduler): each request's
    # generated tokens are the trace's output_length, 1 where it has none (as explain --gpu-blocks)
    capacity_tokens(gpu_blocks, block_size)  # the bound on gpu_blocks, before any work
    config = (ExplainConfig(block_size) if gpu_blocks is None else
              ExplainConfig(block_size, engine=EngineConfig(gpu_blocks, block_size)))
    path, name, tok = next(iter(each_trace([trace], "auto", None)))
    requests, _ = ordered_requests(path, "auto", tok, name)
    explainer, prompts = Explainer(config), []
    for request in as_given(requests, path):
        if explainer.add(request) is not None:
            prompts.append((request.token_ids, request.cache_salt))
    explained = explainer.result.explained
    rows, joined_by = join([e.id for e in explained], read_engine_log(engine_log))
    cache = None if events is None else EngineCache(_checked_batches(events, block_size), prompts, block_size)
    ids = [e.id for e in explained]
    out = [_audit(AuditedRequest(e.id, row.id, e.prompt_tokens, row.prompt_tokens, row.cached_tokens,
                                 e.reused_tokens), block_size, cache.arrival(e.index) if cache else None, ids)
           for e, row in zip(explained, rows)]
    return Audit(display_name(path), joined_by, out, cache.unplaced if cache else 0,
                 dict(cache.media) if cache else {})


def _checked_batches(events: Path, block_size: int) -> Iterator[EventBatch]:
    """The batches of the events file ``events``, in file order, each ``BlockStored`` checked to hold blocks of
    ``block_size`` tokens (the engine's block size, which the audit's block keys are cut at).

    Raises:
        BadInputError: at ``events:line``, a ``BlockStored`` of another block size; ``events`` holds no batch (a
            recording's header alone: the engine published nothing while it was recorded); the file's own errors
            (:func:`kvcli.engine.recording.read_batches`).
    """
    from kvcli.engine.recording import read_batches

    batches = 0
    for recorded in read_batches(events):
        for event in recorded.batch.events:
            if isinstance(event, BlockStored) and event.block_size != block_size:
                raise BadInputError(f"the engine stored blocks of {event.block_size} tokens, but --block-size is "
                                    f"{block_size}: give the engine's block size", str(events),
                                    int(recorded.source.rsplit(":", 1)[1]))
        batches += 1
        yield recorded.batch
    if not batches:
        raise BadInputError("no KV event batches: the engine published none while it was recorded (a recording "
                            "of this trace's run holds one batch per engine step that stored or removed blocks)",
                            str(events))


def _chunks(tokens: int | None, block_size: int) -> int | None:
    return None if tokens is None else tokens // block_size


def join(ids: list[str], rows: list[EngineReport]) -> tuple[list[EngineReport], str]:
    """The engine's row for each request id, and how they were joined: ``"id"`` when every id is a row's (the
    first row of an id repeated), else ``"order"`` (the i-th row for the i-th request).

    Raises:
        BadInputError: the ids do not all match and the counts differ.
    """
    by_id: dict[str, EngineReport] = {}
    for row in rows:
        if row.id is not None:
            by_id.setdefault(row.id, row)
    if all(i in by_id for i in ids):
        return [by_id[i] for i in ids], "id"
    if len(rows) == len(ids):
        return rows, "order"
    matched = sum(i in by_id for i in ids)
    raise BadInputError(f"cannot join {len(ids)} requests with {len(rows)} engine rows: {matched} ids match, and "
                        "joining by order needs one row a request (the log of this trace's run, in its order)",
                        rows[0].source.rsplit(":", 1)[0] if rows else None)


def _audit(r: AuditedRequest, b: int, blocks: list[BlockHistory] | None, ids: list[str]) -> AuditedRequest:
    """Split ``r``'s difference into causes (module docstring)."""
    predicted = r.predicted_cached_tokens
    whole = predicted // b * b
    causes: Counter[str] = Counter()
    if r.engine_prompt_tokens is not None and r.engine_prompt_tokens != r.prompt_tokens:
        causes["prompt_differs"] = r.difference_tokens
    else:
        causes["whole_last_block"] = whole - predicted
        base = whole
        if blocks is not None:
            cap = (r.prompt_tokens - 1) // b
            run = next((k for k, h in enumerate(blocks[:cap]) if not h.held), min(cap, len(blocks)))
            r.events_cached_tokens = base = run * b
            if run * b > whole:
                causes["kept_by_engine"] = run * b - whole
            elif run * b < whole:
                cause, by = _missing(blocks[run])
                causes[cause] = run * b - whole
                r.evicted_by = [ids[i] for i in by]
        r.unexplained_tokens = r.engine_cached_tokens - base
    r.causes = {c: causes[c] for c in CAUSES if causes[c]}
    return r


def _missing(block: BlockHistory) -> tuple[str, tuple[int, ...]]:
    """Why a block the prediction holds was not in the engine's cache on arrival, and who evicted it."""
    if block.stored_before:
        return "evicted_by_engine", block.removed_by
    if block.held_blind:
        return "salt_or_extra_keys", ()
    if block.stored_later:
        return "not_yet_stored", ()
    return "never_stored", ()


def audit_body(audit: Audit, block_size: int, gpu_blocks: int | None, top: int = 5) -> dict[str, Any]:
    """The ``--json`` document's body: the settings and ``traces[0]`` with totals, top causes and per request."""
    rows = audit.requests
    causes = audit.causes()
    trace = {
        "name": audit.name, "joined_by": audit.joined_by, "requests": len(rows),
        "requests_exact": audit.requests_exact,
        "engine_cached_tokens": sum(r.engine_cached_tokens for r in rows),
        "predicted_cached_tokens": sum(r.predicted_cached_tokens for r in rows),
        "difference_tokens": sum(r.difference_tokens for r in rows),
        "causes": causes, "top_causes": [{"cause": c, "tokens": t} for c, t in list(causes.items())[:top]],
        "unexplained_tokens": audit.unexplained_tokens, "unplaced_batches": audit.unplaced_batches,
        "media": audit.media,
        "per_request": [{"id": r.id, "engine_id": r.engine_id, "prompt_tokens": r.prompt_tokens,
                         "engine_prompt_tokens": r.engine_prompt_tokens,
                         "engine_cached_tokens": r.engine_cached_tokens,
                         "predicted_cached_tokens": r.predicted_cached_tokens,
                         "events_cached_tokens": r.events_cached_tokens, "difference_tokens": r.difference_tokens,
                         "causes": r.causes, "unexplained_tokens": r.unexplained_tokens,
                         "evicted_by": r.evicted_by} for r in rows],
    }
    return {"block_size": block_size, "gpu_blocks": gpu_blocks,
            "capacity_tokens": capacity_tokens(gpu_blocks, block_size), "traces": [trace]}
