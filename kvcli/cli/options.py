"""Options shared by every command that talks to Redis: ``--redis-timeout`` (and its parser)."""
from __future__ import annotations

from typing import Annotated

import typer

from kvcli.errors import BadInputError

RedisTimeout = Annotated[str, typer.Option(
    "--redis-timeout", envvar="KVCLI_REDIS_TIMEOUT", help="Longest wait for the connect and for each Redis reply "
    "(e.g. 10s, 500ms); then the call fails (replay: a miss, counted). A dropped connection is retried twice "
    "first.")]
DEFAULT_REDIS_TIMEOUT = "10s"  # = kvcli.store.server.DEFAULT_TIMEOUT


def timeout_seconds(text: str) -> float:
    """``--redis-timeout`` in seconds (:func:`kvcli.units.parse_duration`), > 0.

    Raises:
        BadInputError: not a duration, or not > 0.
    """
    from kvcli.units import parse_duration

    seconds = parse_duration(text)
    if not seconds > 0:
        raise BadInputError(f"--redis-timeout must be > 0, got {text!r}")
    return seconds
