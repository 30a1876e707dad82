"""The traces ``kvcli stats`` reads, each to a :class:`~kvcli.analysis.report.TraceReport`."""
from __future__ import annotations

from pathlib import Path

from kvcli.analysis.report import TraceReport
from kvcli.analysis.stats import trace_stats
from kvcli.model.load import resolve_tokenizer
from kvcli.model.tokenize import get_tokenizer, lazy_tokenizer
from kvcli.traces.detect import detect_format, read_trace, trace_note
from kvcli.traces.hashids import HASH_ID_FORMATS, TraceFormat, as_trace_format
from kvcli.traces.paths import display_name, expand_paths, stdin_paths
from kvcli.traces.records import read_first_record


def trace_reports(paths: list[Path], fmt: str | TraceFormat, tokenizer: str | None, top: int) -> list[TraceReport]:
    """One report per trace file of ``paths`` (directories expanded, ``-`` for stdin), read with ``fmt`` and
    ``tokenizer`` (None: ``cl100k_base``) as every command reads them.

    Raises:
        BadInputError: a missing path, an undetectable or ambiguous format, a bad record (``file:line``).
    """
    tok = lazy_tokenizer(resolve_tokenizer(tokenizer, "cpu"))[0]
    reports = []
    with stdin_paths(paths) as given:
        for path in expand_paths(given):
            name = as_trace_format(fmt).name
            name = detect_format(path) if name == "auto" else name
            stats = trace_stats(read_trace(path, fmt, tok), top)
            reports.append(TraceReport(display_name(path), name, stats, trace_note(path, fmt),
                                       get_tokenizer(tok).decode if _is_text(path, name) else None))
    return reports


def _is_text(path: Path, fmt: str) -> bool:
    """Whether a trace's prompts are text (their first words can be shown): not a hash-id trace, and not a native
    trace of ``token_ids``."""
    if fmt in HASH_ID_FORMATS:
        return False
    if fmt == "native":
        record = read_first_record(path)[1]
        return not (isinstance(record, dict) and "token_ids" in record)
    return True
