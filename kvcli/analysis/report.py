"""``kvcli stats``'s output: the JSON body and the rich tables of :class:`~kvcli.analysis.stats.TraceStats`."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvcli.analysis.stats import PERCENTILES, TraceStats
from kvcli.tables import print_table

GRANULARITY = ("tokens: each request's shared prefix is its longest common prefix with an earlier request of "
               "the same cache_salt, exact to the token (hash-id traces: over the tokens synthesized per block)")
#: characters of a prefix's first words shown.
WORDS_CHARS = 60


@dataclass(frozen=True)
class TraceReport:
    """One trace's statistics and how to show them: its name, format, its notes (the hash-id note and the double-BOS
    note, :mod:`kvcli.traces.bos`, joined by "; "; None when neither applies) and ``words``
    (token ids to text, for a text trace; None for token-id and hash-id traces)."""

    name: str
    fmt: str
    stats: TraceStats
    note: str | None = None
    words: Callable[[np.ndarray], str] | None = None

    def first_words(self, head: np.ndarray) -> str | None:
        """The first words of a run (whitespace collapsed, at most :data:`WORDS_CHARS` characters)."""
        if self.words is None:
            return None
        text = re.sub(r"\s+", " ", self.words(head)).strip()
        return text if len(text) <= WORDS_CHARS else text[:WORDS_CHARS - 3] + "..."


def to_body(reports: list[TraceReport]) -> dict:
    """The JSON body (for :func:`kvcli.units.json_document`): ``granularity`` and one object per trace."""
    return {"granularity": GRANULARITY, "traces": [_trace_json(r) for r in reports]}


def _trace_json(report: TraceReport) -> dict:
    s = report.stats
    return {
        "trace": report.name, "format": report.fmt, "note": report.note, "requests": s.requests,
        "sessions": s.sessions, "prompt_tokens": s.prompt_tokens,
        **{f"prompt_tokens_p{p}": s.percentiles.get(p) for p in PERCENTILES},
        "prompt_tokens_max": s.max_prompt_tokens, "prompt_tokens_mean": s.mean_prompt_tokens,
        "shared_prefix_tokens": s.shared_tokens, "shared_prefix_token_ratio": s.shared_token_ratio,
        "reordered_requests": s.reordered, "blend": None if s.blend is None else s.blend.to_dict(),
        "models": s.models,
        "top_shared_prefixes": [{"start_tokens": p.start, "run_tokens": p.tokens, "prefix_tokens": p.end,
                                 "requests": p.requests, "saved_tokens": p.saved_tokens, "cache_salt": p.cache_salt,
                                 "model": p.model,
                                 "first_words": report.first_words(p.head)} for p in s.top],
    }


def print_stats(reports: list[TraceReport], console: Console) -> None:
    """The summary table (one row per trace), then each trace's top shared prefixes."""
    table = Table(title=Text("workload (prompt tokens; shared: inside a prefix shared with an earlier request)"),
                  title_justify="left")
    blended = any(r.stats.blend is not None for r in reports)
    columns = ["trace", "format", "requests", "sessions", "prompt tokens",
               *(f"p{p}" for p in PERCENTILES), "max", "shared tokens", "shared", *(["+ blend"] * blended)]
    for column in columns:
        table.add_column(column, justify="left" if column in ("trace", "format") else "right")
    for r in reports:
        s = r.stats
        table.add_row(r.name, r.fmt, f"{s.requests:,}", "–" if s.sessions is None else f"{s.sessions:,}",
                      f"{s.prompt_tokens:,}", *(f"{s.percentiles[p]:,.0f}" if s.percentiles else "–"
                                                for p in PERCENTILES),
                      f"{s.max_prompt_tokens:,}", f"{s.shared_tokens:,}",
                      "–" if s.shared_token_ratio is None else f"{s.shared_token_ratio:.1%}",
                      *([_blend_cell(s)] * blended))
    table.caption = f"granularity: {GRANULARITY}"
    table.caption_justify = "left"
    print_table(console, table, keep=1)
    for r in reports:
        if r.note:
            console.print(Text(f"{r.name}: {r.note}"))
        if r.stats.blend is not None:
            console.print(Text(f"{r.name}: reuse at any position (CacheBlend; units: {r.stats.blend.unit}; an "
                               f"unlimited cache): {r.stats.blend.line('shared prefix')}"))
        if r.stats.top:
            print_table(console, _top_table(r), keep=1)


def _blend_cell(s: TraceStats) -> str:
    """The blend column: tokens reusable beyond the shared prefix, as a share of the prompt tokens."""
    share = None if s.blend is None else s.blend.ratio(s.blend.blend_tokens)
    return "–" if share is None else f"{share:.1%}"


def _top_table(report: TraceReport) -> Table:
    table = Table(title=Text(f"{report.name}: top shared prefixes by tokens they would save (a run: tokens from "
                             "start to end of a prefix that later requests reuse whole)"), title_justify="left")
    text, salted = report.words is not None, any(p.cache_salt for p in report.stats.top)
    for column in ("#", *(["cache_salt"] * salted), "start", "end", "run tokens", "requests", "saved tokens",
                   *(["first words"] * text)):
        table.add_column(column, justify="left" if column in ("cache_salt", "first words") else "right")
    for i, p in enumerate(report.stats.top, 1):
        table.add_row(str(i), *([p.cache_salt] * salted), f"{p.start:,}", f"{p.end:,}", f"{p.tokens:,}",
                      f"{p.requests:,}", f"{p.saved_tokens:,}", *([report.first_words(p.head) or ""] * text))
    return table
