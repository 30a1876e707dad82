"""The errors kvcli raises for its users, and the exit code each one maps to at the CLI.

Three tiers (STYLE.md): asserts for invariants, this family for users, one line on stderr at the CLI.
"""
from __future__ import annotations

import re
from typing import Any


class KvcliError(Exception):
    """Root of every error kvcli reports to a user. ``exit_code`` is the CLI's exit status for it."""

    exit_code = 1


class BadInputError(KvcliError):
    """Bad input (a trace, an option, a file). Exit code 2.

    Args:
        message: what is wrong and, where possible, how to fix it.
        path: the file it was found in, if any.
        line: the 1-based line (or record) number in ``path``, if known.
    """

    exit_code = 2

    def __init__(self, message: str, path: str | None = None, line: int | None = None) -> None:
        self.path, self.line, self.reason = path, line, message
        where = f"{path}:{line}: " if path and line else (f"{path}: " if path else "")
        super().__init__(one_line(where + message))


def one_line(text: str) -> str:
    """``text`` as one printable line: control characters (a newline in a JSON key, a file name) are escaped."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def json_type(value: Any) -> str:
    """What a parsed JSON value is, in JSON's own words, as an error message says it: "an object", "a list" (a JSON
    array), "a string", "a number", "a boolean", "null". A Python type outside JSON (a Parquet cell's bytes, a
    datetime) is named by its type."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


class RedisFailure(KvcliError):
    """The Redis server could not be reached or refused a command. Exit code 3."""

    exit_code = 3


class ModelFailure(KvcliError):
    """The local model could not be built or run (shape, memory, device). Exit code 4."""

    exit_code = 4


class EngineFailure(ModelFailure):
    """A serving engine (an OpenAI-compatible server: ``kvcli profile --engine``) could not be reached, did not
    answer as one, or lacks what a measurement needs (prefix caching, cached-token counts). Exit code 4: the engine
    is where the model runs."""


_PIPELINE = re.compile(r"Command # \d+ \((\S+)(?: (\S+))?.*?\) of pipeline caused error: (.*)", re.DOTALL)
_BYTES = re.compile(r"""b'(?:[^'\\]|\\.)*'|b"(?:[^"\\]|\\.)*"|<memory at 0x[0-9a-fA-F]+>""")


def redis_error_text(exc: BaseException) -> str:
    """A Redis error as one printable line without the data it carried: redis-py's echo of a failed pipeline
    command (``Command # 3 (SET key <payload>) of pipeline caused error: OOM ...``) becomes ``OOM ... (SET key)``,
    and any bytes value in the text becomes ``<bytes>``, so an error never prints raw payload bytes."""
    text = str(exc)
    m = _PIPELINE.fullmatch(text.strip())
    if m:
        text = f"{m[3]} ({m[1]}{' ' + m[2] if m[2] else ''})"
    if type(exc).__name__ == "OutOfMemoryError" and not text.startswith("OOM"):
        text = "OOM " + text  # redis-py drops the server's error code from the message
    text = _BYTES.sub("<bytes>", text)
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in " ".join(text.split()))
    return text[:500] + ("..." if len(text) > 500 else "")
