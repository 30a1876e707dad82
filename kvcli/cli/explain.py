"""``kvcli explain``: why each request reused what it did, where its prompt diverged (no Redis)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvcli.cli.options import (
    CAPACITY_BYTES_HELP,
    CAPACITY_TOKENS_HELP,
    DEFAULT_REDIS_TIMEOUT,
    TRACE_FORMATS_HELP,
    TRACES_HELP,
    AddSpecialTokens,
    AtOnce,
    DropTailBlock,
    Dtype,
    GpuBlocks,
    HashBlockTokens,
    HtmlOut,
    JsonOut,
    MaxNumBatchedTokens,
    MaxNumSeqs,
    Model,
    OutputLength,
    PrefillRate,
    RedisTimeout,
    RedisUrl,
    SkipBadRecords,
    StepSeconds,
    TimestampUnit,
    Tokenizer,
    engine_config,
    one_chunk_size,
    output_length,
    timeout_seconds,
    trace_format,
)

HASH_HELP = ("Block hashes the chunk map (--request) names chunks by: kvcli (replay's and inspect's keys), or a "
             "serving engine's own chain, so the output joins with its logs and KV events: vllm (its default "
             "sha256), vllm-sha256_cbor, vllm-xxhash, vllm-xxhash_cbor, each as vLLM 0.33.0 hashes or @VERSION "
             "another release's (vllm@0.28.0, vllm-sha256@0.9.2: 0.8.3 to 0.34.0), sglang (HiCache storage "
             "keys), lmcache (its builtin hash), lmcache-sha256, ... (docs/explain.md).")


def explain(
    traces: Annotated[list[Path], typer.Argument(help=TRACES_HELP + ".")],
    chunk_size: Annotated[str, typer.Option(help="Tokens per chunk (an engine's block size, e.g. vLLM's 16, "
                                                 "LMCache's 256).")] = "256",
    capacity_tokens: Annotated[Optional[int], typer.Option(help=CAPACITY_TOKENS_HELP)] = None,
    capacity_bytes: Annotated[Optional[str], typer.Option(help=CAPACITY_BYTES_HELP)] = None,
    ttl: Annotated[Optional[float], typer.Option(help="Chunks expire SECONDS after the write that stored them "
                                                      "(trace timestamps).")] = None,
    ttl_refresh: Annotated[bool, typer.Option(help="With --ttl: from a chunk's last request instead.")] = False,
    gpu_blocks: GpuBlocks = None, max_num_seqs: MaxNumSeqs = None, max_num_batched_tokens: MaxNumBatchedTokens = None,
    output_tokens: OutputLength = None, step_seconds: StepSeconds = None, prefill_rate: PrefillRate = None,
    at_once: AtOnce = False,
    request: Annotated[Optional[str], typer.Option("--request", help="Map one request (its id) chunk by chunk "
                                                                     "beside its best predecessor.")] = None,
    hash_scheme: Annotated[str, typer.Option("--hash", help=HASH_HELP)] = "kvcli",
    hash_seed: Annotated[Optional[str], typer.Option(help="The PYTHONHASHSEED the engine ran with (vLLM and "
                                                          "LMCache derive their root hash from it).")] = None,
    top: Annotated[int, typer.Option(help="Divergence sites listed per trace.")] = 10,
    namespace: Annotated[Optional[str], typer.Option(help="Also read this kvcli namespace of a live cache "
                                                          "(read-only, one round trip per request): its chunks "
                                                          "count as held, as replay --namespace reads them. Needs "
                                                          "--redis-url or REDIS_URL.")] = None,
    redis_url: RedisUrl = None, redis_timeout: RedisTimeout = DEFAULT_REDIS_TIMEOUT,
    model: Model = "cpu", dtype: Dtype = None, tokenizer: Tokenizer = None,
    fmt: Annotated[str, typer.Option("--format", help=TRACE_FORMATS_HELP)] = "auto",
    hash_block_tokens: HashBlockTokens = None, timestamp_unit: TimestampUnit = None,
    drop_tail_block: DropTailBlock = False, skip_bad_records: SkipBadRecords = False,
    add_special_tokens: AddSpecialTokens = True,
    json_out: JsonOut = False,
    html: HtmlOut = None,
) -> None:
    """Why each request reused what it did, token by token.

    At one chunk size, each request's prompt tokens split into reused and lost, by
    cause (the chunk boundary, eviction by the capacity, expiry by the TTL, the last-token rule, another cache
    salt, divergence from its best predecessor), and where the prompt first differs from that predecessor (the
    message, role and field of a chat prompt, with both sides' text; the token position otherwise). Replay's own
    rules, no Redis (unless --namespace reads a live cache beside): the totals are replay's hit tokens and upper bound.
    With --gpu-blocks, a vLLM engine's block pool holds the chunks instead of an LRU: each request reuses what the
    engine would report as its num_cached_tokens, one request at a time or --max-num-seqs at once.

    Examples:

      kvcli explain sample_traces/chat_shared_system.jsonl --chunk-size 16

      kvcli explain mooncake.jsonl --capacity-tokens 2000000 --json

      kvcli explain chats.jsonl --request r42 --hash vllm --hash-seed 0

      kvcli explain mooncake.jsonl --chunk-size 512 --html explain.html   # the per-request timeline, drawn

      kvcli explain chats.jsonl --chunk-size 16 --gpu-blocks 5001 --max-num-seqs 64 --output-length trace
    """
    from kvcli.analysis.explain_report import explain_notes, print_explained, to_body
    from kvcli.analysis.workload import block_hash_scheme, explain_config, explain_traces
    from kvcli.errors import BadInputError
    from kvcli.tables import stdout_console
    from kvcli.units import json_document, parse_size

    if top < 0:
        raise BadInputError(f"--top must be >= 0, got {top}")
    if html is not None:
        from kvcli.html.page import check_report_path

        check_report_path(html)
    cs = one_chunk_size(chunk_size)
    engine = engine_config(cs, gpu_blocks, max_num_seqs, max_num_batched_tokens, step_seconds, prefill_rate, at_once)
    if engine is not None and namespace is not None:
        raise BadInputError("--gpu-blocks predicts one engine's own cache: it reads no --namespace beside")
    config = explain_config(cs, model, dtype, tokenizer, capacity_tokens, parse_size(capacity_bytes), ttl,
                            ttl_refresh, engine=engine, output_tokens=output_length(output_tokens, gpu_blocks))
    hashes = block_hash_scheme(hash_scheme, config, hash_seed)
    spec = trace_format(fmt, hash_block_tokens, timestamp_unit, drop_tail_block, skip_bad_records,
                        add_special_tokens)
    if namespace is None:
        explained = explain_traces(traces, spec, tokenizer, config, request, model)
    else:
        import os

        from kvcli.analysis.workload import namespace_lookup
        from kvcli.store.server import ENV_URL, open_redis

        if not (redis_url or os.environ.get(ENV_URL)):
            raise BadInputError("--namespace reads a live cache: give its --redis-url (or set REDIS_URL)")
        with open_redis(redis_url, timeout_seconds(redis_timeout)) as (client, _):
            run = namespace_lookup(client, namespace, config, model, dtype)
            explained = explain_traces(traces, spec, tokenizer, config, request, model, run)
    for note in explain_notes(explained, request, hash_scheme, hash_seed, namespace):
        typer.echo(f"note: {note}", err=True)
    document = json_document("explain", to_body(explained, top, request, hashes), indent=1)
    if html is not None:
        from kvcli.cli.report import write_document_html

        write_document_html(html, document)
    if json_out:
        typer.echo(document)
    else:
        print_explained(explained, stdout_console(), top, request, hashes)
