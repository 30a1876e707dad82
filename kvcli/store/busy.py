"""A server busy running a script: its BUSY replies and the wait before a command is sent again; a script of
kvcli's stopped by another client's ``SCRIPT KILL``.

While a script runs past the server's ``busy-reply-threshold`` (``lua-time-limit``, 5 s by default), the server
answers every other command with ``BUSY`` without running it, so sending the command again once the script ended is
safe. :class:`Backoff` paces those sends: :data:`BASE` seconds, doubling up to :data:`CAP`, for a bounded time in
all (callers: :mod:`kvcli.store.calls`, every store call, bounded by the client's reply timeout; the end-of-run
deletion, :func:`kvcli.store.namespace.purge_own`).
"""
from __future__ import annotations

import re
import time

BASE, CAP = 0.01, 0.5  # seconds: the first wait after a BUSY reply, and the longest

_BUSY = re.compile(r"(?:^|caused error: )BUSY\b")  # a reply, or redis-py's words for one in a pipeline


def is_busy(exc: Exception) -> bool:
    """Whether ``exc`` is the server's BUSY reply (another client's script is running; the command did not run)."""
    return _BUSY.search(str(exc)) is not None


def is_script_killed(exc: Exception) -> bool:
    """Whether ``exc`` says a script of ours was stopped by another client's ``SCRIPT KILL`` ("Script killed by
    user with SCRIPT KILL..."): whatever it would have answered is lost, the server goes on."""
    return "script killed by user" in str(exc).lower()


class Backoff:
    """The waits between sends of a command answered BUSY, for up to ``seconds`` in all from the first one.

    Not thread-safe; one per command (or per batch of commands sent again together).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._deadline: float | None = None
        self._next = BASE

    def wait(self) -> bool:
        """Sleep before the next send (:data:`BASE` seconds doubling up to :data:`CAP`, never past the end);
        False, without sleeping, once ``seconds`` have passed since the first call."""
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self.seconds
        if now >= self._deadline:
            return False
        time.sleep(min(self._next, self._deadline - now))
        self._next = min(CAP, 2 * self._next)
        return True
