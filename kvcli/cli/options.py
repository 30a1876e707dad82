"""Options that several commands share, each declared once with its parser: ``--redis-url``, ``--redis-timeout``,
``--chunk-sizes`` (a comma list) and the local model's ``--model``, ``--dtype``, ``--device``, ``--threads``,
``--tokenizer``, plus ``--json``.

Each is an ``Annotated`` type for a command's signature (``redis_url: RedisUrl = None``). Where a command says
more in its help (route's ``--redis-url`` is for its cache-manager policy, in its own help panel), it builds the
option with the same factory and its own help: the flag names, environment variable and parser stay the same.
"""
from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from kvcli.errors import BadInputError

REDIS_URL_HELP = ("Redis URL (redis://, rediss://, unix://). Default: an embedded server started (and stopped) for "
                  "this command.")
REDIS_TIMEOUT_HELP = ("Longest wait for the connect and for each Redis reply (e.g. 10s, 500ms); then the call fails "
                      "(replay counts it as a miss and goes on; other commands stop, exit 3). A dropped connection "
                      "is retried twice first.")
DEFAULT_REDIS_TIMEOUT = "10s"  # = kvcli.store.server.DEFAULT_TIMEOUT
DEFAULT_CHUNK_SIZES = "16,64,256,1024"


def redis_url_option(help: str = REDIS_URL_HELP, **settings: Any) -> Any:
    """``--redis-url`` (or ``$REDIS_URL``), with ``help`` and any further ``typer.Option`` ``settings`` (a
    metavar, a help panel). None: ``$REDIS_URL``, else an embedded server (:func:`kvcli.store.server.open_redis`)."""
    return typer.Option("--redis-url", envvar="REDIS_URL", show_default=False, help=help, **settings)


def redis_timeout_option(help: str = REDIS_TIMEOUT_HELP, **settings: Any) -> Any:
    """``--redis-timeout`` (or ``$KVCLI_REDIS_TIMEOUT``), a duration read by :func:`timeout_seconds`."""
    return typer.Option("--redis-timeout", envvar="KVCLI_REDIS_TIMEOUT", help=help, **settings)


def chunk_sizes_option(what: str = "Chunk sizes") -> Any:
    """``--chunk-sizes`` (or ``--chunk-size``), a comma list read by :func:`parse_chunk_sizes`; ``what`` starts
    its help."""
    return typer.Option("--chunk-sizes", "--chunk-size", help=f"{what}, tokens (comma list; a size given twice "
                        "counts once).")


RedisUrl = Annotated[Optional[str], redis_url_option()]
RedisTimeout = Annotated[str, redis_timeout_option()]
ChunkSizes = Annotated[str, chunk_sizes_option()]
Model = Annotated[str, typer.Option(help="Model preset (tiny, cpu, qwen2.5-0.5b, llama-3-8b, ...) or a local Hugging "
                                         "Face checkpoint folder.")]
Dtype = Annotated[Optional[str], typer.Option(help="KV/model dtype (float32, bfloat16, float16; default: the "
                                                   "model's).")]
Device = Annotated[str, typer.Option(help="auto (CUDA when present), cpu or cuda.")]
Threads = Annotated[int, typer.Option(help="torch threads for the local model on a CPU (1: repeatable timings on a "
                                           "shared machine).")]
Tokenizer = Annotated[Optional[str], typer.Option(help="tiktoken encoding or tokenizer folder for text prompts "
                                                       "(default: the --model folder's own, else cl100k_base).",
                                                  show_default=False)]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


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
    sizes = parse_chunk_sizes(text)
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
