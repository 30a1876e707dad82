"""Printing result tables without losing data: the console results go to, and tables that never cut a number or
a name. Each column is made at least as wide as its widest cell (headers may wrap between words); when the table
is then wider than the console, its columns are split over several tables (the first ``keep`` columns, the row
labels or names, repeated in each). Only a column too wide for the console on its own (a 200-character namespace
at 80 columns) is folded over lines, never cut or ellipsized. Rich draws the tables (:mod:`rich.table`); this
module only sizes and splits them.
"""
from __future__ import annotations

import os
import signal
import sys

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 160


class _Results(Console):
    """A console whose reader may stop early (``| head``): then the command ends quietly with exit 141, as a
    SIGPIPE would end it (rich's own default is exit 1, which scripts read as a kvcli error)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(128 + signal.SIGPIPE)


def stdout_console() -> Console:
    """The console for results: the terminal's width; ``$COLUMNS`` when set; else 160 columns for a pipe or a
    file (rich would otherwise assume 80). A reader that stops early ends the command with exit 141."""
    out = _Results()
    return out if out.is_terminal or os.environ.get("COLUMNS", "").isdigit() else _Results(width=PIPE_WIDTH)


def print_table(console: Console, table: Table, keep: int = 1) -> None:
    """Print ``table`` on ``console``, split by columns when it is too wide (:func:`split_table`)."""
    for part in split_table(console, table, keep):
        console.print(part)


def split_table(console: Console, table: Table, keep: int = 1) -> list[Table]:
    """``table`` as one or more tables that each fit ``console.width`` without cutting a cell: each column exactly
    as wide as its widest cell (or its header's longest word), the columns after the first ``keep`` in as few
    tables as fit, in order, each repeating the first ``keep`` (fewer when they leave no room for some column);
    the caption goes under the last. A column that cannot fit even alone is folded (``overflow="fold"``), never
    cropped."""
    for column in table.columns:
        column.width, column.overflow = max(column.min_width or 0, _needed(console, column)), "fold"
    if _width(console, table) <= console.width or len(table.columns) <= keep + 1:
        return [_loose(console, _folded(console, table))]
    while keep > 1 and any(_width(console, _subset(table, list(range(keep)) + [i], True, False)) > console.width
                           for i in range(keep, len(table.columns))):
        keep -= 1  # the identifying columns leave no room for some column: repeat fewer of them
    key: list[int] = list(range(keep))
    groups: list[list[int]] = [[]]
    for i in range(keep, len(table.columns)):
        if groups[-1] and _width(console, _subset(table, key + groups[-1] + [i], True, False)) > console.width:
            groups.append([])
        groups[-1].append(i)
    return [_loose(console, _folded(console, _subset(table, key + g, n == 0, n == len(groups) - 1)))
            for n, g in enumerate(groups)]


def _loose(console: Console, table: Table) -> Table:
    """With room for every column at its natural width (headers on one line), free the fixed widths; otherwise
    keep them: each column exactly as wide as its widest cell, headers wrapping between words."""
    fixed = [c.width for c in table.columns]
    for column in table.columns:
        column.width = None
    if _width(console, table) > console.width:
        for column, width in zip(table.columns, fixed):
            column.width = width
    return table


def _cell_len(console: Console, cell) -> int:
    if isinstance(cell, str):
        cell = console.render_str(cell)
    if isinstance(cell, Text):
        return max((line.cell_len for line in cell.split("\n")), default=0)
    return Measurement.get(console, console.options.update_width(1 << 20), cell).maximum


def _needed(console: Console, column) -> int:
    """The width a column needs so no cell is wrapped or cut: its widest cell, and its header's longest word."""
    header = console.render_str(column.header) if isinstance(column.header, str) else column.header
    words = str(header).split() if header else []
    return max([_cell_len(console, c) for c in column.cells] + [len(w) for w in words] + [1])


def _width(console: Console, table: Table) -> int:
    """The table's natural width in cells (unwrapped; not clamped to the console as rich's own measure is)."""
    return Measurement.get(console, console.options.update_width(1 << 20), table).maximum


def _folded(console: Console, table: Table) -> Table:
    """A table still too wide (a column wider than the console on its own): its widest columns give up their
    fixed width and fold inside words, so every character is still printed."""
    while _width(console, table) > console.width:
        widest = max((c for c in table.columns if c.width), key=lambda c: c.width or 0, default=None)
        if widest is None:
            break
        widest.width = None
    return table


def _subset(table: Table, columns: list[int], first: bool, last: bool) -> Table:
    """A copy of ``table`` with only ``columns`` (indices), its title on the first part ("continued" after)."""
    title = table.title
    if not first and title is not None:
        title = Text.assemble(title if isinstance(title, Text) else Text.from_markup(str(title)), " (continued)")
    part = Table(title=title, caption=table.caption if last else None, box=table.box, safe_box=table.safe_box,
                 padding=table.padding, collapse_padding=table.collapse_padding, pad_edge=table.pad_edge,
                 show_header=table.show_header, show_edge=table.show_edge, show_lines=table.show_lines,
                 leading=table.leading, style=table.style, row_styles=table.row_styles,
                 header_style=table.header_style, border_style=table.border_style, title_style=table.title_style,
                 caption_style=table.caption_style, title_justify=table.title_justify,
                 caption_justify=table.caption_justify, highlight=table.highlight)
    cells = []
    for i in columns:
        c = table.columns[i]
        part.add_column(c.header, footer=c.footer, header_style=c.header_style, footer_style=c.footer_style,
                        style=c.style, justify=c.justify, vertical=c.vertical, overflow=c.overflow, width=c.width,
                        min_width=c.min_width, max_width=c.max_width, ratio=c.ratio, no_wrap=c.no_wrap,
                        highlight=c.highlight)
        cells.append(list(c.cells))
    for r, row in enumerate(table.rows):
        part.add_row(*(col[r] for col in cells), style=row.style, end_section=row.end_section)
    return part
