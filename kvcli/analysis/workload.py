"""The traces ``kvcli stats`` and ``kvcli explain`` read: each to a :class:`~kvcli.analysis.report.TraceReport` or
a :class:`~kvcli.analysis.explain.TraceExplanation`."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from kvcli.analysis.explain import BlockHashes, ExplainConfig, Explainer, TraceExplanation
from kvcli.analysis.report import TraceReport
from kvcli.analysis.stats import MAX_TOKENS, check_max_tokens, trace_stats
from kvcli.errors import BadInputError, RedisFailure
from kvcli.model.hybridblock import VLLM_VERSION as HYBRID_RULE_VERSION
from kvcli.model.hybridblock import vllm_attention_block
from kvcli.model.load import resolve_spec, resolve_tokenizer
from kvcli.model.tokenize import get_tokenizer, lazy_tokenizer
from kvcli.model.tokenizer_base import Tokenizer
from kvcli.sim.scheduler import EngineConfig
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.enginehash import block_hashes, hash_scheme
from kvcli.store.hashing import PromptChunker, is_block_prompt
from kvcli.store.records import StoreConfig
from kvcli.traces.bos import trace_bos_note
from kvcli.traces.detect import MOONCAKE_ROWS, detect_format, outline_trace, read_trace, trace_note
from kvcli.traces.hashids import HASH_ID_FORMATS, TraceFormat, as_trace_format
from kvcli.traces.mooncake import text_field
from kvcli.traces.order import arrival_order, order_note
from kvcli.traces.paths import as_given, display_name, expand_paths, stdin_paths
from kvcli.traces.records import read_first_record
from kvcli.traces.request import ChatPrompt, Request, models_note


def trace_reports(paths: list[Path], fmt: str | TraceFormat, tokenizer: str | None, top: int,
                  max_tokens: int = MAX_TOKENS, blend_recompute: float | None = None) -> list[TraceReport]:
    """One report per trace file of ``paths`` (directories expanded, ``-`` for stdin), read with ``fmt`` and
    ``tokenizer`` (None: ``cl100k_base``) as every command reads them, each holding at most ``max_tokens``
    distinct prompt tokens (:func:`kvcli.analysis.stats.trace_stats`); with ``blend_recompute``, each with its
    reuse beyond the shared prefix.

    Raises:
        BadInputError: a missing path, an undetectable or ambiguous format, a bad record (``file:line``), a trace
            of more distinct tokens than ``max_tokens``.
    """
    check_max_tokens(max_tokens)
    reports = []
    with stdin_paths(paths) as given:  # around the reads: an error in stdin's copy names <stdin>
        for path, name, tok in each_trace(given, fmt, tokenizer):
            stats = trace_stats(read_trace(path, fmt, tok), top, max_tokens, blend_recompute)
            note = "; ".join(n for n in (trace_note(path, fmt), trace_bos_note(path, fmt, tok),
                                         models_note(stats.models)) if n) or None
            reports.append(TraceReport(display_name(path), name, stats, note,
                                       get_tokenizer(tok).decode if is_text_trace(path, name) else None))
    return reports


def each_trace(paths: list[Path], fmt: str | TraceFormat, tokenizer: str | None, model: str = "cpu"
               ) -> Iterator[tuple[Path, str, Tokenizer | str]]:
    """``(path, format name, tokenizer)`` of each trace file of ``paths`` (directories expanded; ``-`` already
    replaced by :func:`kvcli.traces.paths.stdin_paths`, which the caller holds around its reads so that an error in
    stdin's copy names ``<stdin>``), the tokenizer resolved as replay resolves it for ``model`` (None: the
    checkpoint's own, else ``cl100k_base``) and loaded only when a record holds text.

    Raises:
        BadInputError: a missing path, an undetectable or ambiguous format.
    """
    tok = lazy_tokenizer(resolve_tokenizer(tokenizer, model))[0]
    for path in expand_paths(paths):
        name = as_trace_format(fmt).name
        yield path, detect_format(path) if name == "auto" else name, tok


@dataclass
class ExplainedTrace:
    """One trace explained (:func:`explain_traces`).

    Attributes:
        name: the trace as reports name it. fmt: its format. explanation: the requests explained.
        notes: how it was read (hash-id semantics, reordering, a double BOS). tokens: the prompts of the requests
            asked for with ``request_id`` and of their predecessors, by arrival index (``Request.prompt``: token
            ids ``[tokens]`` uint32, or a hash-id request's block keys).
    """

    name: str
    fmt: str
    explanation: TraceExplanation
    notes: list[str]
    tokens: dict[int, np.ndarray]


def explain_traces(paths: list[Path], fmt: str | TraceFormat, tokenizer: str | None, config: ExplainConfig,
                   request_id: str | None = None, model: str = "cpu",
                   namespace_run: Callable[[Request], int] | None = None, limit: int | None = None
                   ) -> list[ExplainedTrace]:
    """Every trace of ``paths`` (directories expanded, ``-`` for stdin) explained at ``config``, read as every
    command reads it (:func:`each_trace`); with ``request_id``, the traces that hold that request keep its and its
    predecessor's token ids; ``namespace_run``: a live namespace read beside (:func:`namespace_lookup`); ``limit``:
    only the first N requests of each file, as replay's ``--limit`` takes them (then in arrival order).

    Raises:
        BadInputError: a missing path, an undetectable format, a bad record (``file:line``), a request id no trace
            holds, and :meth:`kvcli.analysis.explain.Explainer.add`'s errors.
    """
    with stdin_paths(paths) as given:  # around the reads: an error in stdin's copy names <stdin>
        return _explain_traces(given, fmt, tokenizer, config, request_id, model, namespace_run, limit)


def _explain_traces(paths: list[Path], fmt: str | TraceFormat, tokenizer: str | None, config: ExplainConfig,
                    request_id: str | None, model: str, namespace_run: Callable[[Request], int] | None,
                    limit: int | None = None) -> list[ExplainedTrace]:
    """:func:`explain_traces` on paths with stdin already spooled."""
    out = []
    for path, name, tok in each_trace(paths, fmt, tokenizer, model):
        text = is_text_trace(path, name)
        explainer = Explainer(config, keep_text=text, decode=get_tokenizer(tok).decode if text else None,
                              namespace_run=namespace_run, render=_renderer(tok))
        if request_id is not None:
            explainer.watch.add(request_id)
        requests, order = ordered_requests(path, fmt, tok, name, limit)
        for request in as_given(requests, path):
            explainer.add(request)
        explanation = explainer.result
        explanation.reordered = 0 if order is None else int(np.count_nonzero(order != np.arange(len(order))))
        notes = [n for n in (trace_note(path, fmt), order_note(order, display_name(path)),
                             trace_bos_note(path, fmt, tok), models_note(explanation.models),
                             hybrid_note(explanation)) if n]
        tokens: dict[int, np.ndarray] = {}
        if request_id is not None and explanation.matching(request_id):
            e = explanation.request(request_id)
            wanted = {e.index, e.predecessor} - {-1}
            requests, _ = ordered_requests(path, fmt, tok, name, limit)
            tokens = {i: r.prompt for i, r in enumerate(requests) if i in wanted}
        out.append(ExplainedTrace(display_name(path), name, explanation, notes, tokens))
    if request_id is not None and not any(t.tokens for t in out):
        raise BadInputError(f"no request with id or source {request_id!r} in "
                            f"{', '.join(t.name for t in out) or 'the traces'} (ids are the trace's id field, else "
                            "the reader's: --json lists them under per_request)")
    return out


def _renderer(tok) -> Callable[[ChatPrompt], np.ndarray]:
    """A chat prompt's token ids under ``tok``'s chat template, without the generation prompt."""
    def render(chat: ChatPrompt) -> np.ndarray:
        return get_tokenizer(tok).encode_chat(list(chat.messages), add_generation_prompt=False, tools=chat.tools)

    return render


def ordered_requests(path: Path, fmt: str | TraceFormat, tok, name: str, limit: int | None = None
                     ) -> tuple[Iterator[Request], np.ndarray | None]:
    """The requests of one trace in arrival order (:mod:`kvcli.traces.order`), and the order (None: file order);
    ``limit``: the first N requests of the file only, then ordered. A hash-id trace is streamed when it is already in
    order (its outline, no token ids, tells); other traces are read whole first (their outline would tokenize them
    anyway).

    Raises:
        BadInputError: as the trace's reader.
    """
    if name in HASH_ID_FORMATS:
        order = arrival_order([o.timestamp for o in islice(outline_trace(path, fmt, tok), limit)])
        if order is None:
            return islice(read_trace(path, fmt, tok), limit), None
    requests = list(islice(read_trace(path, fmt, tok), limit))
    order = arrival_order([r.timestamp for r in requests])
    return (iter(requests) if order is None else (requests[i] for i in order.tolist())), order


def is_text_trace(path: Path, fmt: str) -> bool:
    """Whether a trace's prompts are text (their first words can be shown): not a hash-id trace, and not a native
    trace of ``token_ids``; a Mooncake trace (``mooncake``, ``hash-ids``) when its first row's prompt is text
    (:func:`kvcli.traces.mooncake.text_field`: ``messages``, ``text_input``, a payload of text), as its note says
    (:func:`kvcli.traces.detect.trace_note`)."""
    if fmt in MOONCAKE_ROWS:
        return text_field(read_first_record(path)[1]) is not None
    if fmt in HASH_ID_FORMATS:
        return False
    if fmt == "native":
        record = read_first_record(path)[1]
        return not (isinstance(record, dict) and "token_ids" in record)
    return True


def explain_config(chunk_size: int, model: str = "cpu", dtype: str | None = None, tokenizer: str | None = None,
                   capacity_tokens: int | None = None, capacity_bytes: int | None = None, ttl: float | None = None,
                   ttl_refresh: bool = False, kv_dtype: str | None = None, engine: EngineConfig | None = None,
                   output_tokens: int | None = None) -> ExplainConfig:
    """The :class:`~kvcli.analysis.explain.ExplainConfig` of replay's options: the hash root of ``model`` (a preset
    or a checkpoint folder, no weights loaded) and ``tokenizer`` as replay's, and the capacity in chunks as replay's
    store counts it (:attr:`kvcli.store.records.StoreConfig.capacity_chunks`: the smaller of the two, bytes of the
    model's KV payload per chunk, stored as ``kv_dtype``: None or "auto" for the model's dtype, "fp8"); ``engine``
    and ``output_tokens`` as :class:`~kvcli.analysis.explain.ExplainConfig` takes them. For a hybrid model without
    ``engine``, the attention block vLLM would give it at block size ``chunk_size``
    (:func:`kvcli.model.hybridblock.vllm_attention_block`) limits where a request resumes (cause ``hybrid_block``).

    Raises:
        BadInputError: an unknown model or dtype, a capacity or TTL that is not > 0, a chunk size < 1, and
            :class:`~kvcli.analysis.explain.ExplainConfig`'s checks.
    """
    spec = resolve_spec(model, dtype)
    tok_name = lazy_tokenizer(resolve_tokenizer(tokenizer, model))[1]
    chunks = None
    if capacity_tokens is not None or capacity_bytes is not None:
        chunks = StoreConfig(namespace="kvcli-explain", chunk_size=chunk_size, model_id=spec.model_id,
                             tokenizer=tok_name, kv_shape=spec.kv_shape, dtype=spec.dtype, payload="accounted",
                             capacity_tokens=capacity_tokens, capacity_bytes=capacity_bytes,
                             state_shape=spec.state_shape, kv_dtype=kv_dtype).capacity_chunks
    hybrid = vllm_attention_block(spec, chunk_size) if engine is None and chunk_size >= 1 else None
    return ExplainConfig(chunk_size, chunks, ttl, ttl_refresh, spec.model_id, tok_name, engine, output_tokens, hybrid)


def hybrid_note(x: TraceExplanation) -> str | None:
    """The note of a trace explained for a hybrid model (``x.config.hybrid_block`` set), else None: vLLM's block,
    what it cost (``hybrid_block`` tokens) and the requests too short to ever resume."""
    block = x.config.hybrid_block
    if block is None:
        return None
    short = sum(1 for e in x.explained if e.prompt_tokens <= block)
    return (f"a hybrid model: vLLM {HYBRID_RULE_VERSION} enlarges its attention block to {block:,} tokens "
            f"(an attention page holds a Mamba state) and, in its default align mode, resumes a request only at "
            f"such a block's boundary where an earlier request left a Mamba state: "
            f"{x.lost_tokens_by_cause['hybrid_block']:,} tokens the --chunk-size {x.config.chunk_size} cache "
            f"reuses are lost to that (hybrid_block); {short:,} of {x.requests:,} requests have at most {block:,} "
            "prompt tokens and can never resume from the cache")


def block_hash_scheme(scheme: str, config: ExplainConfig, hash_seed: str | None) -> BlockHashes:
    """How explain names blocks: :func:`kvcli.store.enginehash.block_hashes` of ``scheme`` at the config's chunk
    size (kvcli's own under the config's hash root), checked now on an empty prompt's first block.

    Raises:
        BadInputError: an unknown scheme or version (:func:`kvcli.store.enginehash.hash_scheme`), or one that needs
            ``hash_seed`` without it.
    """
    chunker = PromptChunker(config.model_id, config.tokenizer, config.chunk_size)
    try:
        resolved = hash_scheme(scheme)
    except ValueError as err:
        raise BadInputError(f"--hash {scheme}: {err}") from None

    def hashes(prompt, cache_salt: str) -> list[str]:
        if scheme == "kvcli":  # the store's own keys: a hash-id prompt's from its block keys, as replay and warm
            return [h.hex() for h in chunker.hashes(prompt, cache_salt)[0]]
        tokens = prompt.token_ids() if is_block_prompt(prompt) else prompt  # an engine hashes token ids: a
        # hash-id prompt's synthesized ones (BlockKeys.token_ids)
        return block_hashes(scheme, tokens, config.chunk_size, cache_salt=cache_salt, hash_seed=hash_seed,
                            model_id=config.model_id, tokenizer=config.tokenizer)

    try:
        hashes(np.zeros(config.chunk_size, np.uint32), "")
    except ValueError as err:
        raise BadInputError(f"--hash {scheme}: {err}") from None
    return BlockHashes(resolved.label, hashes, resolved.as_json())


def namespace_lookup(client, namespace: str, config: ExplainConfig, model: str = "cpu", dtype: str | None = None
                     ) -> Callable[[Request], int]:
    """``run(request)``: the run of the request's chunks, from chunk 0, that kvcli's namespace ``namespace`` on
    ``client`` holds at the config's chunk size, model and tokenizer, by replay's lookup and chunk judge
    (:meth:`kvcli.store.chunkstore.ChunkStore.lookup`: one read-only round trip per request; nothing written).

    Raises (from ``run``):
        RedisFailure: a lookup failed (the explanation would be wrong, so it stops).
    Raises:
        BadInputError: a namespace kvcli cannot own, an unknown model.
    """
    spec = resolve_spec(model, dtype)
    store = ChunkStore(client, StoreConfig(namespace=namespace, chunk_size=config.chunk_size,
                                           model_id=config.model_id, tokenizer=config.tokenizer,
                                           kv_shape=spec.kv_shape, dtype=spec.dtype, payload="real",
                                           state_shape=spec.state_shape))

    def run(request: Request) -> int:
        look = store.lookup(request.prompt, request.hash_salt, record=False)
        if look.break_reason == "redis-error":
            raise RedisFailure(f"a lookup in namespace {namespace!r} failed ({request.source}): the explanation "
                               "stops rather than count it a miss")
        return look.hit_chunks

    return run
