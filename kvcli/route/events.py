"""What a route run tells its caller while it runs: notes for the user as they arise, each trace's hashing, and
its simulations one by one.

The CLI shows them on stderr (a bar on a terminal); a library caller passes its own :class:`RouteEvents` subclass
to :func:`kvcli.route.runner.route_traces`, or none.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class RouteEvents:
    """A route run's events; every method does nothing here: override the ones you want.

    Per trace, in order: :meth:`reading` (as the trace is hashed), :meth:`simulating`, :meth:`run` once per run,
    :meth:`simulated`; :meth:`note` whenever there is something to say.
    """

    def note(self, line: str) -> None:
        """A line for the user now (no ``kvcli: note:`` prefix, no newline): a sweep that changes none of the
        policies, a trace taken in timestamp order, a Redis server that evicted the cache manager's index."""

    def reading(self, name: str, requests: Iterable[Any]) -> Iterable[Any]:
        """The requests of trace ``name`` as they are read and hashed: returned as they are, or wrapped (for a
        progress bar); every one must be yielded, in order."""
        return requests

    def simulating(self, name: str, runs: int) -> None:
        """Trace ``name``'s ``runs`` simulations begin."""

    def run(self, what: str) -> None:
        """One simulation begins: its policy and the swept values that change it (``"cost w=2"``)."""

    def simulated(self, name: str) -> None:
        """Trace ``name``'s simulations are done."""
