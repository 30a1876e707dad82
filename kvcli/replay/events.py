"""What a replay tells its caller while it runs: each phase as it begins, requests done, each trace's result as
soon as that trace is done, and lines for the user (the cleanup after an interruption, what was left).

The CLI shows them on stderr (a bar on a terminal, one line per phase elsewhere); a library caller passes its
own :class:`ReplayEvents` subclass to :func:`kvcli.replay.runner.run_replay`, or none.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvcli.replay.results import TraceResult


class ReplayEvents:
    """A replay's events; every method does nothing here: override the ones you want.

    Phases, in order: ``"checking N traces"`` and ``"loading the model ..."`` (when a model runs: a bad trace is
    refused before it loads), ``"calibrating prefill ..."`` (the base points, when this machine prices prefill),
    then per trace ``"trace i of n: name"``, ``"reading name"``, ``"calibrating prefill up to N tokens ..."`` (when
    the trace's prompts are longer than the points so far), ``"replaying name: R requests x C stores"`` (then
    :meth:`requests`), ``"cleaning up: ..."`` (unless the keys are kept).
    """

    def phase(self, text: str) -> None:
        """A phase begins; ``text`` says what it is (one line, no newline)."""

    def requests(self, trace: str, done: int, total: int | None) -> None:
        """``done`` of the trace's ``total`` requests are replayed (called after every request: keep it cheap);
        ``total`` None: not known until the trace is read (a trace checked as it is read)."""

    def trace_done(self, result: TraceResult) -> None:
        """``result``'s trace is done (its keys deleted unless kept); called before the next trace starts."""

    def note(self, line: str) -> None:
        """A line for the user now: the cleanup after an interruption, and what it left."""
