"""Trace readers (one module per format), format detection, and warm's prompt sources. May import: kvcli.errors,
kvcli.units and kvcli.model.tokenize (no store, no torch).

Trace readers: a prompt trace file in, :class:`Request` objects (prompt token ids) out, lazily, in trace order.

Entry point: ``read_trace(path, fmt="auto", tokenizer="cl100k_base")``; ``tokenizer`` is a tiktoken name, a Hugging
Face tokenizer folder or a loaded :class:`~kvcli.model.tokenizer_base.Tokenizer`. Every format may be
gzip-compressed (detected by the gzip magic bytes, whatever the suffix). JSONL files are streamed line by line
(a line longer than :data:`kvcli.traces.records.MAX_LINE_BYTES`, 64 MiB, is refused before it is read whole);
JSON documents (ShareGPT lists, SWE-agent ``.traj``) are a single JSON value and are loaded whole. Text is UTF-8.

Formats (``fmt`` names; ``FORMATS`` maps each to its reader):

``native`` -- kvcli's own JSONL. One JSON object per line; blank lines are skipped. Each object has exactly one of

* ``prompt``: a string, tokenized as a completion prompt (no chat template; a Hugging Face tokenizer adds its
  special tokens, e.g. a BOS, as vLLM does);
* ``messages``: a list of OpenAI chat messages, tokenized with the tokenizer's chat template plus the generation
  prompt (tiktoken: kvcli's ChatML, :mod:`kvcli.model.tokenize`, ``<|im_start|>assistant\\n``; a Hugging Face
  tokenizer: its own ``apply_chat_template``, :mod:`kvcli.model.hf_tokenizer`);
* ``token_ids``: a list of integer token ids in ``[0, 2**32)``, used as given;

and optionally ``id`` (string or integer; default ``"<file name>:<line>"``), ``timestamp`` (arrival time in
**seconds** from the trace's start, a finite number >= 0), ``session_id`` (string or integer), ``cache_salt``
(string; tenant isolation, default ``""``), ``output_length`` (integer >= 0, tokens generated) and
``add_special_tokens`` (bool: whether a ``prompt`` text gets the tokenizer's special tokens, a BOS; default: the
reader's, ``--add-special-tokens``; :mod:`kvcli.traces.bos` names a double BOS). Other keys
are ignored. An empty prompt (``""``, ``[]`` messages without generation content, ``token_ids: []``) is not an
error here: the request comes out with an empty (or header-only) token array. Example::

    {"id": "r1", "timestamp": 0.5, "session_id": "s1", "cache_salt": "acme", "output_length": 40,
     "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]}

A file of OpenAI request bodies (``{"model", "messages", "tools", ...}`` per line) is native: ``tools`` (a list of
tool objects, with ``messages`` only) are part of the prompt, handed to a Hugging Face template as the engine hands
them, or rendered by kvcli's ChatML as a system message after a leading one.

``openai-batch``, ``gateway`` -- OpenAI Batch input lines (``custom_id``, ``body``) and gateway logs (LiteLLM
spend logs, JSONL or CSV: a request field and a time field): :mod:`kvcli.traces.openai`,
:mod:`kvcli.traces.gateway`; each body renders as a native record does. ``lines`` -- one completion prompt per
line (:mod:`kvcli.traces.lines`).

``mooncake`` -- Mooncake (FAST'25) JSONL: ``timestamp`` (ms; converted to seconds), ``input_length``,
``output_length``, ``hash_ids`` (prefix-chained block ids, 512 tokens per block). There is no text, so token
ids are synthesized by :func:`mooncake_token_ids`: equal hash ids give equal 512-token blocks. ``id`` is
``"<file name>:<line>"``; an optional ``session_id`` and ``cache_salt`` are kept.

``mooncake``, ``bailian``, ``hash-ids``, ``claude-code`` -- hash-id traces with explicit block semantics
(:mod:`kvcli.traces.hashids`, :mod:`kvcli.traces.claude_code`): Mooncake, Qwen-Bailian (16 tokens per id,
seconds, sessions from ``parent_chat_id``), records with ``block_size``, SemiAnalysis Claude-Code sessions (64
tokens per id, ids scoped per session). Every record is checked the same way, ``len(hash_ids) == ceil(input_length
/ B)``. ``fmt`` may be a :class:`~kvcli.traces.hashids.TraceFormat` that declares tokens per id, the timestamp
unit, a private tail block or skipping bad records. Token ids come from :func:`kvcli.traces.synth.block_token_ids`,
one function for every block size.

``sharegpt`` -- a JSON list of conversations (or one conversation object, or JSONL with one per line), each
``{"id"|"conversation_id", "conversations": [{"from": ..., "value": str}, ...], "system"?: str, "tools"?: str}``
(``role``/``content`` are accepted in place of ``from``/``value``; a value may also be a list of OpenAI content
parts, ``[{"type": "text", "text": ...}]``, joined as a native message's are:
:func:`kvcli.model.tokenizer_base.message_text`). ``from`` maps to a chat role (human/user ->
user, gpt/assistant/chatgpt/bing/bard -> assistant, system -> system, function_call -> assistant, observation/tool
-> tool). A non-empty ``system`` becomes a leading system message, then non-empty ``tools`` (glaive tool-use
format, a JSON string; not ``"[]"``) a system message ``"Tools available:\\n" + tools``. **Each assistant turn is
one request**: its prompt is the whole conversation before it (chat template + generation prompt), so the turns of
a conversation share their history as a token prefix (with a Hugging Face template each prompt renders its whole
message prefix, as the engine does, and the sharing is the template's: :mod:`kvcli.model.hf_tokenizer`).
``session_id`` is the conversation id (else ``"<file name>#<record number>"``), ``id`` is ``"<session_id>:<k>"``
(k = 1-based assistant turn), ``output_length`` is the token count of that turn's text.

``swe-agent`` -- a SWE-agent trajectory (``.traj``, a JSON object whose ``history`` is the ordered list of chat
messages with ``role`` and ``content``, sometimes ``tool_calls``). Each ``assistant`` message (not marked
``is_demo``) is one LLM call; its prompt is every earlier message of the same ``agent`` (chat template +
generation prompt); ``output_length`` is its token count; ``session_id`` is the file stem; ``id`` is
``"<stem>:<k>"`` (k = 1-based call number).

Auto-detection (:func:`detect_format`, reads only the first record of a JSONL file): a ``.traj`` suffix ->
swe-agent; ``.txt`` -> lines; a first non-space character ``[`` -> sharegpt; a first line that is a CSV header with
a gateway log's columns -> gateway; other CSV refused; in a file named ``.json``, ``.jsonl`` or ``.ndjson``, a first
line that is JSON but not an object (null, a number, a string) refused; any other first line not starting with
``{`` -> lines; otherwise the first record (the first non-blank line, or the whole document when that line is a
lone ``{``) decides by the signature it fits (:func:`kvcli.traces.detect.record_format`): ``hash_ids`` -> a
hash-id format (bailian with ``chat_id``, ``parent_chat_id``, ``turn`` or ``type``, else hash-ids with
``block_size``, else mooncake); ``requests`` with ``block_size`` or ``hash_id_scope`` -> claude-code;
``conversations`` -> sharegpt; ``history`` -> swe-agent; ``custom_id`` and ``body`` -> openai-batch; a request and
a time field -> gateway; ``prompt``/``messages``/``token_ids`` -> native (not ``messages`` alone beside a gateway
row's fields). No signature takes precedence over another: a record that fits two is refused, naming the formats to
pass. CSV other than a gateway log is refused, by the one rule every command applies
(:func:`kvcli.traces.detect.refuse_csv`): an Azure LLM inference trace (known by its
``TIMESTAMP,ContextTokens,GeneratedTokens`` header; prompt lengths only, so no prefix sharing can be derived) or any
``.csv``/``.tsv`` file.

Order: readers yield file order; commands take requests in arrival order (:mod:`kvcli.traces.order`: timestamps
when every request has one, stable) and say when that reorders a trace. ``-`` (stdin) is spooled to a file by
:func:`kvcli.traces.paths.stdin_paths` so every reader and format works on it.

Errors: every problem with the input is a :class:`~kvcli.errors.BadInputError` carrying the path and, where
there is one, the 1-based line (JSONL) or record number (JSON lists; the ``history`` position for swe-agent), so
that ``str(err)`` reads ``"<path>:<line>: <message>"``. Record errors are raised when iteration reaches them;
a missing file, an unknown format name or an undetectable format are raised by :func:`read_trace` itself.
"""
from kvcli.traces.detect import FORMATS, detect_format, read_trace
from kvcli.traces.mooncake import MOONCAKE_BLOCK_TOKENS, mooncake_token_ids
from kvcli.traces.native import token_array
from kvcli.traces.request import Request

__all__ = ["FORMATS", "MOONCAKE_BLOCK_TOKENS", "Request", "detect_format", "mooncake_token_ids", "read_trace",
           "token_array"]
