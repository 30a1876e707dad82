"""``kvcli warm``, ``kvcli inspect`` and ``kvcli purge``: thin typer commands over :mod:`kvcli.live.warm`,
:mod:`kvcli.live.inspect` (and :mod:`kvcli.live.chunkmap`, :mod:`kvcli.live.inspect_lmcache`) and
:mod:`kvcli.store.namespace`; their views and JSON are :mod:`kvcli.live.report`.

Registered by :mod:`kvcli.cli.app` (``app.command("warm")(handle_errors(warm))``, ...). Results go to stdout (rich
tables, or one JSON document with ``--json``), progress and notes to stderr. kvcli's errors propagate to
``handle_errors``, which prints one line and exits with the error's code.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from kvcli.cli.options import (
    DEFAULT_CHUNK_SIZES,
    DEFAULT_REDIS_TIMEOUT,
    AddSpecialTokens,
    ChunkSizes,
    Device,
    DropTailBlock,
    Dtype,
    HashBlockTokens,
    JsonOut,
    KvDtype,
    MapKvDtype,
    Model,
    RedisTimeout,
    RedisUrl,
    SkipBadRecords,
    Threads,
    TimestampUnit,
    Tokenizer,
    chunk_sizes_option,
    one_chunk_size,
    parse_chunk_sizes,
    seed_option,
    timeout_seconds,
    trace_format,
)
from kvcli.errors import BadInputError, RedisFailure
from kvcli.live.report import (
    inspect_view,
    lmcache_view,
    map_view,
    print_view,
    purge_count_line,
    purge_scope,
    purge_view,
    to_json,
    warm_view,
)
from kvcli.store.lmcache import LMCACHE_LAYOUTS
from kvcli.tables import stdout_console
from kvcli.units import check_seed

err = Console(stderr=True, soft_wrap=True)  # never hard-wrapped: a grep must find a line whole
Namespace = Annotated[str, typer.Option(help="Key namespace.")]
Seed = Annotated[int, seed_option("Model weight seed of a preset (part of its model id).")]
Format = Annotated[str, typer.Option("--format", help="auto, lines, native, mooncake, bailian, hash-ids, "
                                                     "claude-code, ragpulse, sharegpt, swe-agent.")]


#: ``kvcli warm --help``'s panels (:func:`~kvcli.cli.options.help_panels`).
WARM_PANELS = {
    "Store": ("namespace", "chunk_size", "layout", "redis_url", "redis_timeout"),
    "Model": ("model", "dtype", "kv_dtype", "device", "threads", "seed"),
    "Prompts": ("fmt", "tokenizer", "add_special_tokens"),
    "Writes and output": ("ttl", "dry_run", "verify", "strict", "json_out"),
}


def warm(
    sources: Annotated[list[str], typer.Argument(help="Prompt files (one prompt per line), traces (JSONL with "
                                                 "prompt/messages/token_ids, Mooncake, ShareGPT, .traj), or -.")],
    namespace: Namespace = "default", chunk_size: ChunkSizes = DEFAULT_CHUNK_SIZES, model: Model = "cpu",
    dtype: Dtype = None, device: Device = "auto", threads: Threads = 1, seed: Seed = 0, tokenizer: Tokenizer = None,
    kv_dtype: KvDtype = "auto",
    fmt: Format = "auto", ttl: Annotated[Optional[int], typer.Option(help="Expire written chunks after SECONDS.", min=1,
                                               max=10**15)] = None,  # Redis refuses EX beyond ~9.2e15 s
    dry_run: Annotated[bool, typer.Option(help="Write nothing; report what would be written.")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Read present chunks' payloads and rewrite those that "
                                         "fail their checksum (presence and length are always checked).")] = False,
    strict: Annotated[bool, typer.Option(help="Refuse to write when the estimate does not fit maxmemory.")] = False,
    redis_url: RedisUrl = None, json_out: JsonOut = False,
    redis_timeout: RedisTimeout = DEFAULT_REDIS_TIMEOUT,
    hash_block_tokens: HashBlockTokens = None, timestamp_unit: TimestampUnit = None,
    drop_tail_block: DropTailBlock = False, skip_bad_records: SkipBadRecords = False,
    add_special_tokens: AddSpecialTokens = True,
    layout: Annotated[str, typer.Option(help="kvcli (its own keys), or one of LMCache's layouts: lmcache "
                                             "(redis://), lmcache-resp (resp://), lmcache-mp (multiprocess mode); "
                                             "their keys are named NAMESPACE/CHUNK_SIZE/MODEL@...")] = "kvcli",
) -> None:
    """Fill a live cache ahead of traffic.

    Compute each prompt's KV with the local model and store its full chunks.

    Idempotent (chunks already there are neither recomputed nor rewritten); prompts sharing a prefix compute it once.
    With --layout lmcache, lmcache-resp or lmcache-mp, the chunks are written as LMCache's connector writes them
    (LMCache's rule: everything after the hit run is written; no --ttl, --verify or --kv-dtype fp8).

    Examples:

      kvcli warm system_prompts.txt --redis-url redis://cache:6379 --chunk-size 256 --ttl 86400

      cat preambles.jsonl | kvcli warm - --namespace fleet --dry-run --json
    """
    from kvcli.live.warm import WarmConfig
    from kvcli.live.warm import warm as run_warm
    from kvcli.live.warm_lmcache import warm_lmcache
    from kvcli.model.load import load_model, resolve_spec, resolve_tokenizer
    from kvcli.model.threads import torch_threads
    from kvcli.model.tokenize import lazy_tokenizer
    from kvcli.replay.results import check_count
    from kvcli.store.server import open_redis
    from kvcli.traces.prompts import read_prompts

    check_seed(seed)
    check_count("--threads", threads)
    if layout not in ("kvcli", *LMCACHE_LAYOUTS):
        raise BadInputError(f"--layout must be kvcli or one of {', '.join(LMCACHE_LAYOUTS)}, got {layout!r}")
    tok, tok_name = lazy_tokenizer(resolve_tokenizer(tokenizer, model))
    config = WarmConfig(namespace, parse_chunk_sizes(chunk_size), tok_name, ttl, dry_run, strict, verify=verify,
                        kv_dtype=kv_dtype)
    timeout = timeout_seconds(redis_timeout)
    say = lambda line: err.print(line, markup=False, highlight=False)  # noqa: E731
    requests = read_prompts(sources, trace_format(fmt, hash_block_tokens, timestamp_unit, drop_tail_block,
                                                  skip_bad_records, add_special_tokens), tok, notify=say)
    spec = resolve_spec(model, dtype, seed)
    with torch_threads(None if dry_run else threads):
        local = None if dry_run else load_model(model, dtype, device, seed)
        with open_redis(redis_url, timeout) as (client, target), _WarmBar() as bar:
            if target.embedded and not dry_run:
                err.print("note: no --redis-url: warming an embedded server that stops when this command ends")
            result = (run_warm(client, requests, local, config, bar.update, spec, say) if layout == "kvcli" else
                      warm_lmcache(client, requests, local, config, layout, bar.update, spec))
    _show("warm", result, json_out, warm_view)
    if result.evicted_keys:
        err.print(f"warning: the server evicted {result.evicted_keys:,} keys during this warm; what was written may "
                  f"already be gone", markup=False, highlight=False, soft_wrap=True)
    if result.stopped:
        raise RedisFailure(result.stopped)


#: ``kvcli inspect --help``'s panels.
INSPECT_PANELS = {
    "Store": ("namespace", "chunk_size", "layout", "redis_url", "redis_timeout"),
    "A prompt's chunks (--prompt, --tokens, --request)": ("prompt", "tokens", "request", "model", "dtype", "seed",
                                                         "kv_dtype", "tokenizer", "cache_salt", "fmt",
                                                         "add_special_tokens"),
    "Checks and output": ("sample", "verify", "json_out"),
}


def inspect(
    namespace: Annotated[Optional[str], typer.Option(help="Only this namespace (map: default 'default').")] = None,
    chunk_size: Annotated[str, chunk_sizes_option("Chunk sizes for --prompt, --tokens and --request")
                          ] = DEFAULT_CHUNK_SIZES,
    sample: Annotated[Optional[int], typer.Option(help="MEMORY USAGE of N sampled keys (0: none; default: all).",
                                                  min=0)] = None,
    verify: Annotated[Optional[bool], typer.Option("--verify/--no-verify", help="Check payload checksums "
                                                   "(default: when payloads total <= 256 MiB).")] = None,
    prompt: Annotated[Optional[str], typer.Option(help="Map this prompt text's chunks.")] = None,
    tokens: Annotated[Optional[Path], typer.Option(help="Map the token ids in FILE: integers separated by "
                                                        "whitespace or commas, or one JSON array.")] = None,
    request: Annotated[Optional[str], typer.Option(help="Map a trace request: TRACE:LINE.")] = None,
    model: Model = "cpu", dtype: Dtype = None, seed: Seed = 0, kv_dtype: MapKvDtype = "auto",
    tokenizer: Tokenizer = None,
    cache_salt: Annotated[Optional[str], typer.Option(
        help="Tenant salt (part of the chunk hash) for --prompt/--tokens; with --request, overrides the record's.",
        show_default=False)] = None,
    fmt: Format = "auto",
    layout: Annotated[str, typer.Option(help="kvcli (its own keys), or lmcache: an LMCache Redis backend's "
                                             "keys in each of LMCache 0.5.6's layouts (redis://, resp://, "
                                             "multiprocess; lmcache-resp and lmcache-mp say the same), by model.")
                      ] = "kvcli",
    redis_url: RedisUrl = None, json_out: JsonOut = False,
    redis_timeout: RedisTimeout = DEFAULT_REDIS_TIMEOUT,
    hash_block_tokens: HashBlockTokens = None, timestamp_unit: TimestampUnit = None,
    drop_tail_block: DropTailBlock = False, skip_bad_records: SkipBadRecords = False,
    add_special_tokens: AddSpecialTokens = True,
) -> None:
    """Read a live cache without changing it.

    kvcli's keys by namespace, model and chunk size, memory, TTLs, ages,
    integrity (orphans, checksum failures, unreachable chunks); or one prompt's chunk-by-chunk hit map; or, with
    --layout lmcache, what an LMCache Redis backend holds: which of LMCache's layouts (redis://, resp://,
    multiprocess, or unknown) and per layout chunks, bytes, orphans, memory by model.

    Examples:

      kvcli inspect --redis-url redis://cache:6379 --sample 1000

      kvcli inspect --namespace fleet --prompt "You are a helpful assistant." --chunk-size 16 --json

      kvcli inspect --layout lmcache --redis-url redis://lmcache-redis:6379 --sample 2000
    """
    from kvcli.live.inspect import inspect_cache
    from kvcli.model.load import resolve_tokenizer, spec_of
    from kvcli.model.tokenize import lazy_tokenizer
    from kvcli.store.serde import check_kv_dtype
    from kvcli.store.server import open_redis

    check_seed(seed)
    stored = check_kv_dtype(kv_dtype)
    if layout not in ("kvcli", *LMCACHE_LAYOUTS):
        raise BadInputError(f"--layout must be kvcli or lmcache (or {', '.join(LMCACHE_LAYOUTS[1:])}), got "
                            f"{layout!r}")
    timeout = timeout_seconds(redis_timeout)
    if layout in LMCACHE_LAYOUTS:
        return _inspect_lmcache(redis_url, timeout, sample, json_out, namespace=namespace, verify=verify,
                                prompt=prompt, tokens=tokens, request=request)
    tok, tok_name = lazy_tokenizer(resolve_tokenizer(tokenizer, model))
    read_as = trace_format(fmt, hash_block_tokens, timestamp_unit, drop_tail_block, skip_bad_records,
                           add_special_tokens)
    ids = _prompt_ids(prompt, tokens, request, tok, read_as, cache_salt)
    sizes = () if ids is None else parse_chunk_sizes(chunk_size)  # only a chunk map has chunk sizes
    spec = None if ids is None else spec_of(model, dtype, seed)
    with open_redis(redis_url, timeout) as (client, target):
        if target.embedded:
            err.print("note: no --redis-url: inspecting a fresh embedded server (empty)")
        if ids is None:
            return _show("inspect", inspect_cache(client, namespace, sample, verify), json_out, inspect_view)
        maps = _chunk_maps(client, ids, namespace or "default", sizes, spec or model, tok, tok_name, stored)
    _show("inspect", maps, json_out, map_view)


def _chunk_maps(client, ids: tuple, namespace: str, sizes: tuple[int, ...], model, tok, tok_name: str,
                kv_dtype: str | None) -> list:
    """One prompt's chunk map per chunk size (``ids``: token ids, or a hash-id record's block keys, and the cache
    salt), read over one NO-TOUCH connection; their warnings on stderr. ``model``: a
    :class:`~kvcli.model.presets.ModelSpec`, whose store's payload layout (with ``kv_dtype``) each chunk is judged
    against, or a bare model id (judged against the prompt's chunk 0). A double BOS at the prompt's start is named
    where a map finds its first chunk missing."""
    import numpy as np

    from kvcli.live.chunkmap import absent_warnings, chunk_map
    from kvcli.live.reading import reader
    from kvcli.store.judge import Expected
    from kvcli.store.preflight import server_memory
    from kvcli.store.records import StoreConfig
    from kvcli.traces.bos import prompt_bos_note

    model_id = model if isinstance(model, str) else model.model_id
    expects = {cs: None if isinstance(model, str) else Expected.of_store(StoreConfig(
        namespace, cs, model_id, tok_name, model.kv_shape, model.dtype, kv_dtype=kv_dtype,
        state_shape=model.state_shape)) for cs in sizes}
    cause = prompt_bos_note(ids[0], tok) if isinstance(ids[0], np.ndarray) else None
    with reader(client) as conn:  # one connection, CLIENT NO-TOUCH where the server has it
        server = server_memory(conn)
        maps = [chunk_map(conn, ids[0], namespace, cs, model_id, tok_name, ids[1], server, expects[cs])
                for cs in sizes]
        maps = absent_warnings(conn, maps, cause or "")
    for m in maps:
        if m.warning:
            err.print(f"warning: {m.warning}", markup=False, highlight=False)
    return maps


def _inspect_lmcache(redis_url: str | None, timeout: float, sample: int | None, json_out: bool,
                     **kvcli_only) -> None:
    """``inspect --layout lmcache``: refuses kvcli-layout options, then reads and prints the LMCache summary
    (``timeout``: seconds for the connect and each reply, as ``--redis-timeout``)."""
    from kvcli.live.inspect_lmcache import inspect_lmcache
    from kvcli.store.server import open_redis

    given = [f"--{k}" for k, v in kvcli_only.items() if v is not None]
    if given:
        raise BadInputError(f"{', '.join(given)}: not with an LMCache --layout (they read kvcli's own layout)")
    with open_redis(redis_url, timeout) as (client, target):
        if target.embedded:
            err.print("note: no --redis-url: inspecting a fresh embedded server (empty)")
        result = inspect_lmcache(client, sample)
    _show("inspect", result, json_out, lmcache_view)


def purge(
    namespace: Annotated[str, typer.Option(help="The namespace to delete (required).", show_default=False)],
    chunk_size: Annotated[Optional[str], typer.Option("--chunk-size", "--chunk-sizes", help="Only this chunk size "
                                                      "(one).", show_default=False)] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Really delete (without it: count only).")] = False,
    redis_url: RedisUrl = None, json_out: JsonOut = False,
    redis_timeout: RedisTimeout = DEFAULT_REDIS_TIMEOUT,
    layout: Annotated[str, typer.Option(help="kvcli (its own keys), or lmcache, lmcache-resp, lmcache-mp: the keys "
                                             "in that LMCache layout a replay --keep or a warm left (model names "
                                             "NAMESPACE/...).")] = "kvcli",
) -> None:
    """Delete kvcli's keys of ONE namespace, nothing else.

    Only that namespace (and optionally one chunk size): shows the count first, deletes only
    with --yes; SCAN + UNLINK, never FLUSHDB/FLUSHALL; foreign keys and other namespaces are never touched.

    Examples:

      kvcli purge --namespace fleet --redis-url redis://cache:6379

      kvcli purge --namespace fleet --chunk-size 16 --yes

      kvcli purge --namespace replay-1796194786-5312-891e0e --layout lmcache --yes
    """
    from kvcli.store.kvstore import check_purge_layout, count_layout, purge_layout
    from kvcli.store.namespace import purge_command
    from kvcli.store.server import open_redis

    size = None if chunk_size is None else one_chunk_size(chunk_size)
    check_purge_layout(layout, size)
    scope = purge_scope(namespace, size) + {"lmcache": " (LMCache layout)", "lmcache-resp": " (LMCache resp:// layout)",
                                            "lmcache-mp": " (LMCache multiprocess layout)"}.get(layout, "")
    owner = "LMCache" if layout.startswith("lmcache") else "kvcli"
    with open_redis(redis_url, timeout_seconds(redis_timeout)) as (client, target):
        if target.embedded:
            err.print("note: no --redis-url: purging a fresh embedded server (empty)")
        try:
            found = count_layout(client, namespace, size, layout)
            err.print(purge_count_line(found, scope, owner), markup=False, highlight=False, soft_wrap=True)
            if found.keys and not yes:
                if json_out:  # the count, for a script that decides (deleted: 0); still exit 2
                    typer.echo(to_json("purge", found))
                raise BadInputError(f"nothing deleted: add --yes to delete these {found.keys:,} keys")
            done = purge_layout(client, namespace, size, layout) if yes else found
        except RedisFailure as exc:  # what is left is still there: say how to finish
            again = purge_command(target, namespace, size, layout) if yes else ""
            raise RedisFailure(str(exc).rstrip(".") + (f"; remove what is left with: {again} (again)" if yes else "")
                               ) from None
    _show("purge", done, json_out, functools.partial(purge_view, scope=scope, owner=owner))


# -- helpers ----------------------------------------------------------------------------------------------------------
def _show(command: str, result, json_out: bool, view) -> None:
    """A command's result on stdout: its JSON document with ``--json``, else its view (:mod:`kvcli.live.report`)."""
    if json_out:
        typer.echo(to_json(command, result))
    else:
        print_view(stdout_console(), view(result))


def _prompt_ids(prompt, tokens, request, tok, fmt, cache_salt: str | None = None):
    """``(token ids, cache salt)`` of the one prompt to map (text tokenized with ``tok``, a
    tokenizer or its name; a hash-id record's block keys, hashed as replay and warm hash them), or None for the
    summary. The salt is ``cache_salt``
    when given, else the record's (``--request``) or ""."""
    if sum(x is not None for x in (prompt, tokens, request)) > 1:
        raise BadInputError("give one of --prompt, --tokens, --request")
    if prompt is not None:
        from kvcli.model.tokenize import get_tokenizer

        return get_tokenizer(tok).encode_prompt(prompt), cache_salt or ""
    if tokens is not None:
        from kvcli.traces.tokenfile import read_token_file

        return read_token_file(tokens), cache_salt or ""
    if request is not None:
        from kvcli.traces.detect import read_trace

        path, _, line = request.rpartition(":")
        if not path or not line.isdigit():
            raise BadInputError(f"--request must be TRACE:LINE, got {request!r}")
        for r in read_trace(path, fmt, tok):
            if r.source.rpartition(":")[2] == line:
                return r.prompt, r.hash_salt if cache_salt is None else cache_salt
        raise BadInputError(f"no request at line {line}", path=path)
    return None


class _WarmBar:
    """Progress on stderr: chunks written of the plan, chunks/s and MB/s; nothing when stderr is not a terminal."""

    def __enter__(self):
        self.bar = Progress(TextColumn("warm"), BarColumn(), MofNCompleteColumn(), _Rates(), TimeElapsedColumn(),
                            console=err, transient=True, disable=not err.is_terminal)
        self.bar.__enter__()
        self.task = None
        return self

    def update(self, chunks: int, nbytes: int, total_chunks: int, total_bytes: int) -> None:
        if self.task is None:
            self.task = self.bar.add_task("warm", total=total_chunks or 1, bytes=0)
        self.bar.update(self.task, completed=chunks, bytes=nbytes)

    def __exit__(self, *exc):
        self.bar.__exit__(*exc)
        return False


class _Rates(ProgressColumn):
    def render(self, task) -> Text:
        elapsed = task.elapsed or 0.0
        if not elapsed:
            return Text("")
        return Text(f"{task.completed / elapsed:,.0f} chunks/s {task.fields.get('bytes', 0) / elapsed / 1e6:,.1f} MB/s")
