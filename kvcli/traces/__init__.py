"""Trace readers (one module per format), format detection, and warm's prompt sources. May import: kvcli.errors,
kvcli.units, kvcli.outfile (export's files) and kvcli.model.tokenize (no store, no torch).

A prompt trace file in, :class:`Request` objects (prompt token ids) out, lazily, in file order:
``read_trace(path, fmt="auto", tokenizer="cl100k_base")``, ``tokenizer`` a tiktoken name, a Hugging Face tokenizer
folder or a loaded :class:`~kvcli.model.tokenizer_base.Tokenizer`. ``FORMATS`` maps each format name (native,
openai-batch, gateway, lines, mooncake, bailian, hash-ids, claude-code, ragpulse, sharegpt, swe-agent) to its
reader; any file may be gzip-compressed; JSONL is streamed, a line over
:data:`kvcli.traces.records.MAX_LINE_BYTES` refused; a Parquet file (Mooncake rows, native records) is read a row
batch at a time through pyarrow.
The formats, the auto-detection rule and what each reader makes of a record are specified in docs/traces.md
("Trace formats", "Reader rules in full").

Errors: every problem with the input is a :class:`~kvcli.errors.BadInputError` whose ``str()`` reads
``"<path>:<line>: <message>"`` (the record number for JSON lists, the ``history`` position for swe-agent); record
errors are raised when iteration reaches them, a missing file, an unknown format name or an undetectable format by
:func:`read_trace` itself.
"""
from kvcli.traces.detect import FORMATS, detect_format, read_trace
from kvcli.traces.mooncake import MOONCAKE_BLOCK_TOKENS, mooncake_token_ids
from kvcli.traces.native import token_array
from kvcli.traces.request import Request

__all__ = ["FORMATS", "MOONCAKE_BLOCK_TOKENS", "Request", "detect_format", "mooncake_token_ids", "read_trace",
           "token_array"]
