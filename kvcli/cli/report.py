"""``kvcli report``: saved ``--json`` documents drawn as one HTML page; and what the ``--html FILE`` of replay,
explain and route write: the document their ``--json`` prints, drawn (:mod:`kvcli.html`). Replay's document gets
explain's per-request breakdown first (:func:`replay_document`), so that the page has its timeline and the JSON
printed beside it draws the same page again."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from kvcli.replay.results import ReplayConfig, TraceResult
    from kvcli.traces.hashids import TraceFormat

err = Console(stderr=True, soft_wrap=True)


def report(
    documents: Annotated[list[Path], typer.Argument(help="kvcli JSON documents: what replay, explain or route print "
                                                         "with --json (- for one on stdin).", show_default=False)],
    html: Annotated[Path, typer.Option("--html", metavar="FILE", help="Write the page here: one self-contained "
                                                                      "HTML file.", show_default=False)],
) -> None:
    """Draw saved --json results as one HTML page.

    The page opens offline: each replay's answer, curves and (where the
    document has it) per-request timeline, each explain's timeline and causes, each route's policies against load
    and per-node balance; every figure with its numbers. A run on a big machine is drawn anywhere.

    Examples:

      kvcli replay trace.jsonl --json > replay.json && kvcli report replay.json --html report.html

      kvcli report replay.json explain.json route.json --html report.html
    """
    from kvcli.html.documents import read_document
    from kvcli.html.page import check_report_path

    check_report_path(html)
    write_html(html, [read_document(path) for path in documents])


def write_html(path: Path, documents: list) -> None:
    """Write the page of ``documents`` (:class:`kvcli.html.documents.Document`) to ``path`` and say so on stderr."""
    from kvcli.html.page import write_report
    from kvcli.units import fmt_bytes

    size = write_report(path, documents)
    err.print(f"report written: {path} ({fmt_bytes(size)})", highlight=False, markup=False)


def write_document_html(path: Path, text: str) -> None:
    """Draw one document this run made (``text``: its JSON, as ``--json`` prints it) into ``path``."""
    from kvcli.html.documents import as_document

    write_html(path, [as_document(json.loads(text), "this run")])


def replay_document(results: list[TraceResult], context: dict, explained: dict[str, dict] | None) -> str:
    """Replay's JSON document (:func:`kvcli.replay.report.to_json`), each trace with ``explained``'s breakdown of
    it under ``explain`` where there is one (``explained``: trace name -> explain's trace object)."""
    from kvcli.replay.report import to_json

    text = to_json(results, context)
    if not explained:
        return text
    body = json.loads(text)
    for trace in body["traces"]:
        if trace["trace"] in explained:
            trace["explain"] = explained[trace["trace"]]
    return json.dumps(body, indent=2)


def explain_replayed(files: list[Path], results: list[TraceResult], config: ReplayConfig, fmt: str | TraceFormat,
                     tokenizer: str | None, model: str, dtype: str | None) -> dict[str, dict]:
    """Explain's per-request breakdown of each replayed trace (trace name -> explain's trace object, its causes'
    meanings beside): at the chunk size the trace's answer names (the verdict's focus; else the size with the most
    hit tokens, the largest of equals) and the replay's capacity, read as the replay read it (``fmt``, ``tokenizer``,
    ``--limit``), so that its reused tokens are the replay's hit tokens at that size. A ``--namespace`` the replay
    read is not counted here (a note says so).

    Raises:
        BadInputError: as :func:`kvcli.analysis.workload.explain_traces`.
    """
    from kvcli.analysis.explain_report import to_body
    from kvcli.analysis.workload import explain_config, explain_traces
    from kvcli.traces.paths import display_name, expand_paths

    by_name = {r.trace: r for r in results}
    out: dict[str, dict] = {}
    for path in expand_paths(files):
        result = by_name.get(display_name(path))
        rows = [r for r in result.per_chunk_size if r.requests] if result is not None else []
        if result is None or not rows:
            continue
        focus = result.verdict.focus if result.verdict else None
        size = focus or max(rows, key=lambda r: (r.hit_tokens, r.chunk_size)).chunk_size
        cfg = explain_config(size, model, dtype, tokenizer, config.capacity_tokens, config.capacity_bytes,
                             kv_dtype=config.kv_dtype)
        body = to_body(explain_traces([path], fmt, tokenizer, cfg, model=model, limit=config.limit), top=10)
        trace = {"causes": body["causes"], **body["traces"][0]}
        if config.namespace:
            trace["notes"] = [*trace["notes"], f"the replay also read namespace {config.namespace!r}: its chunks "
                              "are not counted in this breakdown"]
        out[result.trace] = trace
    return out
