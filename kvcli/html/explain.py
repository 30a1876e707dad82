"""A ``kvcli explain --json`` document, drawn: per trace, the run's provenance, the tokens by cause, the per-request
cache timeline with each request's chunk map, and the top divergence sites (:mod:`kvcli.html.timeline`)."""
from __future__ import annotations

from kvcli.html.blocks import Notes, Part, Section
from kvcli.html.documents import Document
from kvcli.html.numbers import count
from kvcli.html.provenance import provenance_facts
from kvcli.html.timeline import explained_parts


def explain_sections(doc: Document) -> list[Section]:
    """One section per trace of the document."""
    causes = doc.body.get("causes") or {}
    return [Section(f"explain: {t['trace']}", "explain", tuple(_trace_parts(doc.body, {**t, "causes": causes})))
            for t in doc.body["traces"]]


def _trace_parts(body: dict, t: dict) -> list[Part]:
    facts = [("trace", f"{t['trace']} ({t.get('format', '?')}): {count(t['requests'])} requests")]
    return [provenance_facts(body, facts), *explained_parts(t, "explain"), Notes(tuple(t.get("notes") or ()))]
