"""The errors kvcli raises for its users, and the exit code each one maps to at the CLI.

Three tiers (STYLE.md): asserts for invariants, this family for users, one line on stderr at the CLI.
"""
from __future__ import annotations


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
        super().__init__(where + message)


class RedisFailure(KvcliError):
    """The Redis server could not be reached or refused a command. Exit code 3."""

    exit_code = 3


class ModelFailure(KvcliError):
    """The local model could not be built or run (shape, memory, device). Exit code 4."""

    exit_code = 4
