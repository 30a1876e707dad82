"""The document kinds a page draws: each ``command`` a view of its own, a function from a
:class:`~kvcli.html.documents.Document` to its sections. Another kind (an audit's) plugs in with a module and an
entry here."""
from __future__ import annotations

from collections.abc import Callable

from kvcli.html.blocks import Section
from kvcli.html.documents import Document
from kvcli.html.explain import explain_sections
from kvcli.html.replay import replay_sections
from kvcli.html.route import route_sections

VIEWS: dict[str, Callable[[Document], list[Section]]] = {
    "replay": replay_sections,
    "explain": explain_sections,
    "route": route_sections,
}
