"""What a page is made of: sections of answers, facts, notes, tables and figures (a Vega-Lite spec with its numbers
beside it), and their HTML. Every text is escaped here; the page's script draws each figure's spec into its
``<div>`` (:mod:`kvcli.html.page`)."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Union


@dataclass(frozen=True)
class Table:
    """Rows of text under column headings (``rows``: each as long as ``columns``); ``caption`` above it."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""


@dataclass(frozen=True)
class Figure:
    """One chart: its title, its Vega-Lite ``spec`` (a JSON-ready dict, data inline), its numbers (``table``,
    shown beside it; None where the tooltips carry them), a ``note`` under it and an ``anchor``: the figure's name
    in its section (its element's id is ``<section id>-<anchor>``, a link target)."""

    title: str
    spec: dict
    table: Table | None = None
    note: str = ""
    anchor: str = ""


@dataclass(frozen=True)
class Answer:
    """The answer a run gives, one line each, as the terminal prints it first."""

    lines: tuple[str, ...]


@dataclass(frozen=True)
class Facts:
    """Label and value pairs (a run's provenance, a trace's counts)."""

    pairs: tuple[tuple[str, str], ...]
    caption: str = ""


@dataclass(frozen=True)
class Notes:
    """A run's notes, one line each."""

    lines: tuple[str, ...]
    caption: str = "notes"


@dataclass(frozen=True)
class Text:
    """A paragraph."""

    text: str


Part = Union[Answer, Facts, Notes, Text, Table, Figure]


@dataclass(frozen=True)
class Section:
    """One trace of one document: its ``title``, the document ``kind`` ("replay", ...) and its parts in order."""

    title: str
    kind: str
    parts: tuple[Part, ...] = field(default_factory=tuple)


def esc(text: object) -> str:
    """``text`` as HTML text (``<``, ``>``, ``&`` and quotes escaped)."""
    return html.escape(str(text), quote=True)


def table_html(table: Table) -> str:
    """A ``<table>``: numbers right-aligned (a cell that starts with a digit, a sign or ``–``)."""
    head = "".join(f"<th>{esc(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in table.rows)
    caption = f"<caption>{esc(table.caption)}</caption>" if table.caption else ""
    return f'<table class="numbers">{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _cell(text: str) -> str:
    numeric = bool(text) and (text[0].isdigit() or text[0] in "-+–$" and len(text) > 1 or text == "–")
    return f'<td class="num">{esc(text)}</td>' if numeric else f"<td>{esc(text)}</td>"


def part_html(part: Part, chart_id: str | None = None, section_id: str = "") -> str:
    """One part's HTML; a figure's chart goes in ``<div id=chart_id>`` (its spec is drawn there by the page), the
    figure itself is ``<figure id=section_id-anchor>``."""
    if isinstance(part, Answer):
        lines = "".join(f"<p>{esc(line)}</p>" for line in part.lines)
        return f'<div class="answer" data-kvcli-answer>{lines}</div>'
    if isinstance(part, Facts):
        rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in part.pairs)
        caption = f"<h4>{esc(part.caption)}</h4>" if part.caption else ""
        return f'<div class="facts">{caption}<dl>{rows}</dl></div>'
    if isinstance(part, Notes):
        if not part.lines:
            return ""
        items = "".join(f"<li>{esc(line)}</li>" for line in part.lines)
        return f'<div class="notes"><h4>{esc(part.caption)}</h4><ul>{items}</ul></div>'
    if isinstance(part, Text):
        return f"<p>{esc(part.text)}</p>"
    if isinstance(part, Table):
        return f'<div class="table-only">{table_html(part)}</div>'
    assert chart_id is not None, "a figure needs its chart's id"
    numbers = f'<div class="side">{table_html(part.table)}</div>' if part.table else ""
    note = f'<p class="note">{esc(part.note)}</p>' if part.note else ""
    anchor = f' id="{esc(section_id)}-{esc(part.anchor)}"' if part.anchor and section_id else ""
    return (f'<figure{anchor}><figcaption>{esc(part.title)}</figcaption><div class="figure-body">'
            f'<div class="chart" id="{chart_id}" data-kvcli-chart></div>{numbers}</div>{note}</figure>')
