"""Options that several commands share, each declared once with its parser: ``--redis-url``, ``--redis-timeout``,
``--chunk-sizes`` (a comma list), ``--seed`` and the local model's ``--model``, ``--dtype``, ``--device``,
``--threads``, ``--tokenizer``, ``--kv-dtype``, plus ``--json`` and ``--html``, and what every command that reads
traces accepts about hash-id traces (``--hash-block-tokens``, ``--timestamp-unit``, ``--drop-tail-block``,
``--skip-bad-records``: :func:`trace_format`).

Every command's help reflows (:class:`HelpCommand`: its docstring's first line is the one-line summary ``kvcli
--help`` lists; every prose paragraph after it is joined into one line for the terminal to wrap). A command with
many options groups them in help panels with :func:`help_panels` (one table per panel, each narrow enough that
``--help`` at 80 columns shows every option name whole).

Each is an ``Annotated`` type for a command's signature (``redis_url: RedisUrl = None``). Where a command says
more in its help (route's ``--redis-url`` is for its cache-manager policy, in its own help panel), it builds the
option with the same factory and its own help: the flag names, environment variable and parser stay the same.
"""
from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperCommand, TyperOption

from kvcli.errors import BadInputError

REDIS_URL_HELP = ("Redis URL (redis://, rediss://, unix://). Default: an embedded server started (and stopped) for "
                  "this command.")
REDIS_TIMEOUT_HELP = ("Longest wait for the connect and for each Redis reply (e.g. 10s, 500ms); then the call fails "
                      "(replay: a lookup counts as a miss, a read of its own is sent again, and 3 failed calls in a "
                      "row stop it, exit 3; other commands stop, exit 3). A dropped connection is retried twice "
                      "first.")
DEFAULT_REDIS_TIMEOUT = "10s"  # = kvcli.store.server.DEFAULT_TIMEOUT
DEFAULT_CHUNK_SIZES = "16,64,256,1024"


def redis_url_option(help: str = REDIS_URL_HELP, **settings: Any) -> Any:
    """``--redis-url`` (or ``$REDIS_URL``), with ``help`` and any further ``typer.Option`` ``settings`` (a
    metavar, a help panel). None: ``$REDIS_URL``, else an embedded server (:func:`kvcli.store.server.open_redis`)."""
    return typer.Option("--redis-url", envvar="REDIS_URL", show_default=False, help=help, **settings)


def redis_timeout_option(help: str = REDIS_TIMEOUT_HELP, **settings: Any) -> Any:
    """``--redis-timeout`` (or ``$KVCLI_REDIS_TIMEOUT``), a duration read by :func:`timeout_seconds`."""
    return typer.Option("--redis-timeout", envvar="KVCLI_REDIS_TIMEOUT", help=help, **settings)


def seed_option(help: str, **settings: Any) -> Any:
    """``--seed``, an integer with ``help`` (its range appended) and any further ``typer.Option`` ``settings``;
    the command checks it with :func:`kvcli.units.check_seed` before any work (a one-line error, exit 2)."""
    return typer.Option("--seed", help=f"{help} An integer in [0, 2**63 - 1].", **settings)


def chunk_sizes_option(what: str = "Chunk sizes") -> Any:
    """``--chunk-sizes`` (or ``--chunk-size``), a comma list read by :func:`parse_chunk_sizes`; ``what`` starts
    its help."""
    return typer.Option("--chunk-sizes", "--chunk-size", help=f"{what}, tokens (comma list; a size given twice "
                        "counts once).")


RedisUrl = Annotated[Optional[str], redis_url_option()]
RedisTimeout = Annotated[str, redis_timeout_option()]
ChunkSizes = Annotated[str, chunk_sizes_option()]
Model = Annotated[str, typer.Option(help="Model preset (tiny, cpu, qwen2.5-0.5b, llama-3.2-1b, llama-3-8b; priced "
                                         "from their configs, --measure 0: deepseek-v3, gpt-oss-120b, gemma-3-27b, "
                                         "qwen3-next-80b-a3b, llama-3.1-70b, qwen3-32b) or a local Hugging Face "
                                         "checkpoint folder (config.json alone prices it).")]
Dtype = Annotated[Optional[str], typer.Option(help="KV/model dtype (float32, bfloat16, float16; default: the "
                                                   "model's).")]
Device = Annotated[str, typer.Option(help="auto (CUDA when present), cpu or cuda.")]
Threads = Annotated[int, typer.Option(help="torch threads for the local model on a CPU (1: repeatable timings on a "
                                           "shared machine).")]
Tokenizer = Annotated[Optional[str], typer.Option(help="tiktoken encoding or tokenizer folder for text prompts "
                                                       "(default: the --model folder's own, else cl100k_base).",
                                                  show_default=False)]
#: --tokenizer of a command without --model (stats, export)
TextTokenizer = Annotated[Optional[str], typer.Option("--tokenizer", help="tiktoken encoding or tokenizer folder for "
                                                      "text prompts (default: cl100k_base).", show_default=False)]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def html_option(**settings: Any) -> Any:
    """``--html FILE``: the command's JSON document drawn as one self-contained page (:mod:`kvcli.html`), with any
    further ``typer.Option`` ``settings`` (a help panel)."""
    return typer.Option("--html", metavar="FILE", show_default=False, help="Also write the result as one "
                        "self-contained HTML page: the --json document drawn, figures with their numbers, no network "
                        "needed to view it (docs/report.md).", **settings)


HtmlOut = Annotated[Optional[Path], html_option()]
KvDtype = Annotated[str, typer.Option(
    "--kv-dtype", metavar="auto|fp8",
    help="Dtype of the stored KV payloads, as engines' --kv-cache-dtype: auto (the model's --dtype, bit-exact) or "
         "fp8 (float8_e4m3fn with a float32 scale per layer for K and for V in each chunk: half of bf16's bytes; "
         "cached prefills run on the dequantized KV and the report gives their largest logit difference).")]
#: --kv-dtype of inspect's chunk map: the payloads it expects, as warm and replay stored them
MapKvDtype = Annotated[str, typer.Option(
    "--kv-dtype", metavar="auto|fp8",
    help="Chunk map: the dtype of the KV payloads replay would read, as warm and replay store them with --kv-dtype: "
         "auto (the model's --dtype) or fp8; a chunk stored in another layout breaks the map there.")]

TRACE_FORMATS_HELP = ("auto, native, mooncake, bailian, hash-ids, claude-code, ragpulse, sharegpt, swe-agent, "
                      "openai-batch, gateway, lines.")
TRACES_HELP = ("Trace files or directories in any --format (native JSONL with prompt/messages/token_ids, OpenAI "
               "Batch, gateway logs, prompt lines, Mooncake, Bailian, RAGPulse and other hash-id traces, ShareGPT, "
               "SWE-agent .traj; detected; .gz accepted), or - for stdin")
LIMIT_HELP = "Read only the first N requests of each trace (N >= 1)."
CAPACITY_TOKENS_HELP = "LRU capacity per chunk size, tokens (e.g. 3000000)."
CAPACITY_BYTES_HELP = "LRU capacity per chunk size, bytes of --model's KV (e.g. 64GiB)."
HASH_IDS_PANEL = "Hash-id traces (Mooncake, Bailian, block_size records, Claude-Code sessions)"
HashBlockTokens = Annotated[Optional[int], typer.Option(
    "--hash-block-tokens", metavar="B", show_default=False, rich_help_panel=HASH_IDS_PANEL,
    help="Tokens per hash id of a hash-id trace (default: the record's block_size, else the format's: Mooncake "
         "512, Bailian 16, Claude-Code 64). Every record is checked: len(hash_ids) == ceil(input_length / B).")]
TimestampUnit = Annotated[Optional[str], typer.Option(
    "--timestamp-unit", metavar="s|ms|us", show_default=False, rich_help_panel=HASH_IDS_PANEL,
    help="Unit of a hash-id trace's timestamps (default: the format's: Mooncake and block_size records ms, "
         "Bailian and Claude-Code s).")]
DropTailBlock = Annotated[bool, typer.Option(
    "--drop-tail-block", rich_help_panel=HASH_IDS_PANEL,
    help="Make each request's last hash id its own, never shared (Bailian: a request's last block id can change "
         "once decoding starts): hits fall by at most one block per request; prompt lengths stay.")]
AddSpecialTokens = Annotated[bool, typer.Option(
    "--add-special-tokens/--no-special-tokens",
    help="Whether a text prompt gets the tokenizer's special tokens (a BOS), as vLLM's /v1/completions adds them by "
         "default. Off for prompts that already hold the rendered chat template (and its BOS): their tokens then "
         "equal the same conversation sent as messages. A record's own add_special_tokens (true/false) wins.")]
SkipBadRecords = Annotated[bool, typer.Option(
    "--skip-bad-records", rich_help_panel=HASH_IDS_PANEL,
    help="Skip (and count, in the report's notes) a hash-id record that fails its checks, instead of stopping "
         "with its file and line.")]
REUSE_PANEL = "Reuse beyond a prefix (CacheBlend)"
Reuse = Annotated[str, typer.Option(
    "--reuse", metavar="prefix|blend", rich_help_panel=REUSE_PANEL,
    help="prefix: the prefix figures; blend: beside them, the tokens reusable at any position as CacheBlend reuses "
         "them (a segment of the trace, such as a RAGPulse hash id, or else a full chunk, seen in an earlier "
         "request, beyond the prefix), with a share recomputed (--blend-recompute). An analysis of the trace, no "
         "store lookup (docs/replay.md, 'Reuse beyond a prefix').")]
BlendRecompute = Annotated[Optional[float], typer.Option(
    "--blend-recompute", metavar="SHARE", show_default=False, rich_help_panel=REUSE_PANEL,
    help="With --reuse blend: the share of blended tokens recomputed, 0 to 1 (default 0.15: LMCache's CacheBlend, "
         "LMCACHE_BLEND_RECOMPUTE_RATIOS).")]
ENGINE_PANEL = "A vLLM engine's own prefix cache (--gpu-blocks; docs/explain.md)"
GpuBlocks = Annotated[Optional[int], typer.Option(
    "--gpu-blocks", metavar="N", show_default=False, rich_help_panel=ENGINE_PANEL,
    help="The engine's num_gpu_blocks (the num_gpu_blocks label of vLLM's vllm:cache_config_info metric, or its "
         "num_gpu_blocks_override), its null block included, at --chunk-size = its --block-size: predict what "
         "vLLM's block pool reuses (its num_cached_tokens), with the blocks running requests hold and its free "
         "queue's eviction order.")]
REPLAY_GPU_BLOCKS_HELP = (
    "A vLLM engine's block count (its num_gpu_blocks) at --chunk-size = its block size: the store's LRU holds "
    "N - 2 chunks (the null block, and the partial last block of the request that "
    "runs). An approximation: exact one request at a time with one output token when every prompt ends inside a "
    "block; a Redis LRU cannot hold the blocks running requests pin, output blocks or duplicate blocks. kvcli "
    "explain --gpu-blocks gives the engine's own figure (docs/explain.md).")


def replay_capacity_tokens(gpu_blocks: int | None, chunk_sizes: tuple[int, ...], capacity_tokens: int | None,
                           capacity_bytes: str | None) -> int | None:
    """replay's ``--capacity-tokens`` for ``--gpu-blocks N``: ``(N - 2) * chunk size`` (:data:`REPLAY_GPU_BLOCKS_HELP`);
    ``capacity_tokens`` itself without ``--gpu-blocks``.

    Raises:
        BadInputError: ``--gpu-blocks`` < 3, with a capacity of its own, or with more than one chunk size.
    """
    if gpu_blocks is None:
        return capacity_tokens
    if capacity_tokens is not None or capacity_bytes is not None:
        raise BadInputError("--gpu-blocks sets the store's capacity: give it without --capacity-tokens and "
                            "--capacity-bytes")
    if len(chunk_sizes) != 1:
        raise BadInputError("--gpu-blocks is one engine's pool: give one --chunk-size, its block size")
    if gpu_blocks < 3:
        raise BadInputError(f"--gpu-blocks must be >= 3 here (the null block and a running request's partial block "
                            f"hold no chunk), got {gpu_blocks}")
    return (gpu_blocks - 2) * chunk_sizes[0]


MaxNumSeqs = Annotated[Optional[int], typer.Option(
    "--max-num-seqs", metavar="N", show_default=False, rich_help_panel=ENGINE_PANEL,
    help="With --gpu-blocks: the engine's max_num_seqs, requests running at once (default 1: one at a time).")]
MaxNumBatchedTokens = Annotated[Optional[int], typer.Option(
    "--max-num-batched-tokens", metavar="N", show_default=False, rich_help_panel=ENGINE_PANEL,
    help="With --gpu-blocks: tokens per engine step (chunked prefill; default 2048, vLLM's).")]
OutputLength = Annotated[Optional[str], typer.Option(
    "--output-length", metavar="N|trace", show_default=False, rich_help_panel=ENGINE_PANEL,
    help="With --gpu-blocks: tokens each request generates (vLLM's max_tokens), or trace: the trace's "
         "output_length, 1 where it has none (the default). Output tokens take blocks too.")]
StepSeconds = Annotated[Optional[float], typer.Option(
    "--step-seconds", metavar="S", show_default=False, rich_help_panel=ENGINE_PANEL,
    help="With --gpu-blocks and --max-num-seqs > 1: an engine step's fixed time, seconds (a decode step; default "
         "0.02). A step takes it plus its tokens at --prefill-tokens-per-second.")]
PrefillRate = Annotated[Optional[float], typer.Option(
    "--prefill-tokens-per-second", metavar="R", show_default=False, rich_help_panel=ENGINE_PANEL,
    help="With --gpu-blocks and --max-num-seqs > 1: tokens a step computes per second (default 10000).")]
AtOnce = Annotated[bool, typer.Option(
    "--at-once", rich_help_panel=ENGINE_PANEL,
    help="With --gpu-blocks: every request arrives at time 0 (an offline batch, vLLM's LLM.generate on a list), "
         "not at its timestamp.")]


def engine_config(block_size: int, gpu_blocks: int | None, max_num_seqs: int | None = None,
                  max_num_batched_tokens: int | None = None, step_seconds: float | None = None,
                  prefill_tokens_per_second: float | None = None, at_once: bool = False):
    """The :class:`kvcli.sim.scheduler.EngineConfig` of ``--gpu-blocks`` and the options that shape the engine,
    unset ones at their defaults; None without ``--gpu-blocks``.

    Raises:
        BadInputError: an engine option without ``--gpu-blocks``, and the config's own checks.
    """
    from kvcli.sim import scheduler

    given = {"--max-num-seqs": max_num_seqs, "--max-num-batched-tokens": max_num_batched_tokens,
             "--step-seconds": step_seconds, "--prefill-tokens-per-second": prefill_tokens_per_second,
             "--at-once": at_once or None}
    if gpu_blocks is None:
        stray = [name for name, value in given.items() if value is not None]
        if stray:
            verb = "shapes" if len(stray) == 1 else "shape"
            raise BadInputError(f"{', '.join(stray)} {verb} the engine of --gpu-blocks: give --gpu-blocks too")
        return None
    def unset(value, default):  # 0 is a value the config refuses, not "unset"
        return default if value is None else value

    return scheduler.EngineConfig(
        gpu_blocks, block_size, unset(max_num_seqs, 1),
        unset(max_num_batched_tokens, scheduler.DEFAULT_MAX_NUM_BATCHED_TOKENS),
        unset(step_seconds, scheduler.DEFAULT_STEP_SECONDS),
        unset(prefill_tokens_per_second, scheduler.DEFAULT_PREFILL_TOKENS_PER_SECOND), at_once)


def output_length(text: str | None, gpu_blocks: int | None) -> int | None:
    """``--output-length``: tokens every request generates, or None for ``trace`` (the default: each request's
    ``output_length``, 1 where it has none).

    Raises:
        BadInputError: not ``trace`` or an integer >= 1, or given without ``--gpu-blocks``.
    """
    if text is None or text == "trace":
        return None
    if gpu_blocks is None:
        raise BadInputError("--output-length says what the engine of --gpu-blocks generates: give --gpu-blocks too")
    try:
        tokens = int(text)
    except ValueError:
        tokens = 0
    if tokens < 1:
        raise BadInputError(f"--output-length must be trace or an integer >= 1, got {text!r}")
    return tokens


def parse_chunk_sizes(text: str) -> tuple[int, ...]:
    """``--chunk-sizes``: ``"16,64,16"`` -> ``(16, 64)``; positive integers, a repeat dropped (the first kept).

    Raises:
        BadInputError: not comma-separated integers, one below 1, or none.
    """
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise BadInputError(f"--chunk-sizes must be positive integers separated by commas, got {text!r}")
    return tuple(dict.fromkeys(sizes))


def one_chunk_size(text: str) -> int:
    """``--chunk-size`` of a command that takes one size (route, purge): :func:`parse_chunk_sizes`, exactly one.

    Raises:
        BadInputError: not a positive integer, or more than one.
    """
    try:
        sizes = parse_chunk_sizes(text)
    except BadInputError:
        raise BadInputError(f"--chunk-size must be a positive integer, got {text!r}") from None
    if len(sizes) != 1:
        raise BadInputError(f"--chunk-size takes one size here, got {text!r}")
    return sizes[0]


def timeout_seconds(text: str) -> float:
    """``--redis-timeout`` in seconds (:func:`kvcli.units.parse_duration`), > 0.

    Raises:
        BadInputError: not a duration, or not > 0.
    """
    import os

    from kvcli.units import parse_duration

    where = " (from $KVCLI_REDIS_TIMEOUT)" if os.environ.get("KVCLI_REDIS_TIMEOUT") == text else ""
    try:
        seconds = parse_duration(text)
    except BadInputError as exc:
        raise BadInputError(f"--redis-timeout{where}: {exc}") from None
    if not seconds > 0:
        raise BadInputError(f"--redis-timeout must be > 0, got {text!r}{where}")
    return seconds


def trace_format(fmt: str, block_tokens: int | None = None, timestamp_unit: str | None = None,
                 drop_tail_block: bool = False, skip_bad_records: bool = False, add_special_tokens: bool = True):
    """The format argument every trace reader takes (:func:`kvcli.traces.detect.read_trace`): ``fmt`` itself when
    no hash-id option and no ``--no-special-tokens`` was given, else a :class:`kvcli.traces.hashids.TraceFormat`
    carrying them.

    Raises:
        BadInputError: ``--hash-block-tokens`` < 1, an unknown ``--timestamp-unit``.
    """
    if (block_tokens is None and timestamp_unit is None and not drop_tail_block and not skip_bad_records
            and add_special_tokens):
        return fmt
    from kvcli.traces.hashids import TraceFormat

    return TraceFormat(fmt, block_tokens, timestamp_unit, drop_tail_block, skip_bad_records, add_special_tokens)


#: the longest line an example keeps in a command's help: rich's help pads a line by one column at each side, so
#: a line this long (its indent included) shows whole in an 80-column terminal
EXAMPLE_WIDTH = 76

#: a shell word: unquoted characters and quoted strings, a quoted string's spaces kept inside the word
_SHELL_WORD = re.compile(r"""(?:[^\s"']+|"[^"]*"|'[^']*')+""")


def reflow(text: str) -> str:
    """``text`` (a command's docstring) with each prose paragraph's lines joined into one, for typer's help: in its
    rich markup mode a docstring's own line breaks show as they are, so a paragraph wrapped by hand in the source
    shows broken at any other width. A paragraph with an indented line (an example, a command line) keeps its
    lines, each command cut to :data:`EXAMPLE_WIDTH` columns by :func:`wrap_example` so that a terminal never
    breaks one inside a word; ``\b`` (click's "do not rewrap") and what follows ``\f`` (click's "not for the
    help") are left alone."""
    help_text, cut, hidden = inspect.cleandoc(text).partition("\f")
    paragraphs = []
    for paragraph in help_text.split("\n\n"):
        lines = paragraph.split("\n")
        if paragraph.startswith("\b"):
            paragraphs.append(paragraph)
        elif any(line[:1].isspace() for line in lines):
            paragraphs.append("\n".join(wrap_example(line) for line in _joined_continuations(lines)))
        else:
            paragraphs.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(paragraphs) + cut + hidden


def _joined_continuations(lines: list[str]) -> list[str]:
    """``lines`` with each line that ends in a shell continuation (`` \\``) joined to the next."""
    joined: list[str] = []
    for line in lines:
        if joined and joined[-1].endswith(" \\"):
            joined[-1] = joined[-1][:-1] + line.strip()
        else:
            joined.append(line)
    return joined


def wrap_example(line: str, width: int = EXAMPLE_WIDTH) -> str:
    """One example line of a help text within ``width`` columns: a command longer than that is cut between shell
    words into lines continued with `` \\`` (the next indented 4 columns more), an option never cut from its
    value nor a quoted string inside, and a trailing comment (``  # ...``) put on a line of its own before the
    command. Pasting the result into a POSIX shell runs the same words as the line. A single word longer than the
    width stays whole."""
    if len(line) <= width:
        return line
    indent = line[:len(line) - len(line.lstrip())]
    command, sep, comment = line.strip().partition("  # ")
    out = [f"{indent}# {comment.strip()}"] if sep else []
    words = _SHELL_WORD.findall(command)
    units: list[str] = []  # an option and its value are cut as one
    for word in words:
        if units and units[-1].startswith("-") and " " not in units[-1] and not word.startswith("-"):
            units[-1] += " " + word
        else:
            units.append(word)
    current = indent
    for word in units:
        if current.strip() and len(current) + 1 + len(word) + 2 > width:
            out.append(current + " \\")
            current = indent + "    "
        current += (" " if current.strip() else "") + word
    out.append(current)
    return "\n".join(out)


class HelpCommand(TyperCommand):
    """A typer command whose help reflows (:func:`reflow`): the first paragraph of its docstring, one line, is what
    ``kvcli --help`` lists for it; the paragraphs after it wrap at the terminal's width in its own ``--help``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.help:
            self.help = reflow(self.help)


def help_panels(panels: Mapping[str, tuple[str, ...]]) -> type[TyperCommand]:
    """A command class (``app.command(name, cls=help_panels({...}))``) whose ``--help`` shows its options in these
    rich help panels: panel title -> the options' parameter names (``"chunk_sizes"``), the panels and the options
    in each in the order given, ``--help`` itself in the first panel; an option named in no panel keeps its own
    panel (``rich_help_panel``, else "Options"), after them. Each panel is a table of its own, sized to its own
    longest names: grouping the options with long negative names (``--no-allow-evictions``) apart from those with
    long aliases (``--chunk-sizes,--chunk-size``) keeps every name whole at 80 columns.

    Raises:
        ValueError: (when the command is built) a name that is not one of the command's parameters.
    """
    where = {name: title for title, names in panels.items() for name in names}
    order = {name: i for i, name in enumerate(name for names in panels.values() for name in names)}
    first = next(iter(panels), None)

    class PanelledCommand(HelpCommand):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            unknown = set(where) - {p.name for p in self.params}
            if unknown:
                raise ValueError(f"help panels name no parameter of {self.name}: {', '.join(sorted(unknown))}")
            for param in self.params:
                if param.name in where:
                    param.rich_help_panel = where[param.name]  # type: ignore[attr-defined]
            # the arguments first, in their order (the parser reads them by position); the options as the panels
            # list them (the help prints them in this order), then the others as declared
            arguments = [p for p in self.params if not isinstance(p, TyperOption)]
            options = [p for p in self.params if isinstance(p, TyperOption)]
            self.params = arguments + sorted(options, key=lambda p: order.get(p.name or "", len(order)))

        def get_help_option(self, ctx: Any) -> Any:
            option = super().get_help_option(ctx)
            if option is not None and first is not None:
                option.rich_help_panel = first
            return option

    return PanelledCommand
