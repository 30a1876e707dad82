"""Trace readers: a prompt trace file in, :class:`Request` objects (prompt token ids) out, lazily, in trace order.

Entry point: ``read_trace(path, fmt="auto", tokenizer="cl100k_base")``. Every format may be gzip-compressed
(detected by the gzip magic bytes, whatever the suffix). JSONL files are streamed line by line; JSON documents
(ShareGPT lists, SWE-agent ``.traj``) are a single JSON value and are loaded whole. Text is UTF-8.

Formats (``fmt`` names; ``FORMATS`` maps each to its reader):

``native`` -- kvcli's own JSONL. One JSON object per line; blank lines are skipped. Each object has exactly one of

* ``prompt``: a string, tokenized as ordinary text (no chat template);
* ``messages``: a list of OpenAI chat messages, tokenized with the chat template of :mod:`kvcli.tokenize`
  plus the generation prompt (``<|im_start|>assistant\\n``);
* ``token_ids``: a list of integer token ids in ``[0, 2**32)``, used as given;

and optionally ``id`` (string or integer; default ``"<file name>:<line>"``), ``timestamp`` (arrival time in
**seconds** from the trace's start, a finite number >= 0), ``session_id`` (string or integer), ``cache_salt``
(string; tenant isolation, default ``""``) and ``output_length`` (integer >= 0, tokens generated). Other keys
are ignored. An empty prompt (``""``, ``[]`` messages without generation content, ``token_ids: []``) is not an
error here: the request comes out with an empty (or header-only) token array. Example::

    {"id": "r1", "timestamp": 0.5, "session_id": "s1", "cache_salt": "acme", "output_length": 40,
     "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]}

``mooncake`` -- Mooncake (FAST'25) JSONL: ``timestamp`` (ms; converted to seconds), ``input_length``,
``output_length``, ``hash_ids`` (prefix-chained block ids, 512 tokens per block). There is no text, so token
ids are synthesized by :func:`mooncake_token_ids`: equal hash ids give equal 512-token blocks. ``id`` is
``"<file name>:<line>"``; an optional ``session_id`` is kept.

``sharegpt`` -- a JSON list of conversations (or one conversation object, or JSONL with one per line), each
``{"id"|"conversation_id", "conversations": [{"from": ..., "value": str}, ...], "system"?: str, "tools"?: str}``
(``role``/``content`` are accepted in place of ``from``/``value``). ``from`` maps to a chat role (human/user ->
user, gpt/assistant/chatgpt/bing/bard -> assistant, system -> system, function_call -> assistant,
observation/tool -> tool). A non-empty ``system`` becomes a leading
system message, then non-empty ``tools`` (glaive tool-use format, a JSON string; not ``"[]"``) a system message
``"Tools available:\\n" + tools``. **Each assistant turn is one request**: its prompt is the whole
conversation before it (chat template + generation prompt), so the turns of a conversation share their history
as a token prefix. ``session_id`` is the conversation id (else ``"<file name>#<record number>"``), ``id`` is
``"<session_id>:<k>"`` (k = 1-based assistant turn), ``output_length`` is the token count of that turn's text.

``swe-agent`` -- a SWE-agent trajectory (``.traj``, a JSON object whose ``history`` is the ordered list of chat
messages with ``role`` and ``content``, sometimes ``tool_calls``). Each ``assistant`` message (not marked
``is_demo``) is one LLM call; its prompt is every earlier message of the same ``agent`` (chat template +
generation prompt); ``output_length`` is its token count; ``session_id`` is the file stem; ``id`` is
``"<stem>:<k>"`` (k = 1-based call number).

Auto-detection (:func:`detect_format`, reads only the first record of a JSONL file): a ``.traj`` suffix ->
swe-agent; a first non-space character ``[`` -> sharegpt; otherwise the first record (the first non-blank line,
or the whole document when that line is a lone ``{``) decides: ``hash_ids`` -> mooncake, ``conversations`` ->
sharegpt, ``history`` -> swe-agent, ``prompt``/``messages``/``token_ids`` -> native.

Errors: every problem with the input is a :class:`~kvcli.errors.BadInputError` carrying the path and, where
there is one, the 1-based line (JSONL) or record number (JSON lists; the ``history`` position for swe-agent), so
that ``str(err)`` reads ``"<path>:<line>: <message>"``. Record errors are raised when iteration reaches them;
a missing file, an unknown format name or an undetectable format are raised by :func:`read_trace` itself.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from kvcli.errors import BadInputError
from kvcli.tokenize import DEFAULT_TOKENIZER, TOKEN_DTYPE, Tokenizer, get_tokenizer, message_role, message_text


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a trace, tokenized.

    Attributes:
        id: the trace's id for it, else ``"<file>:<line>"``.
        token_ids: ``[tokens]`` little-endian uint32 prompt token ids.
        timestamp: arrival time in seconds from the trace's start, or None.
        session_id: conversation/session id, or None.
        cache_salt: tenant salt ("" when none); requests of different salts never share cache.
        output_length: tokens the request generated (for routing's decode time), or None.
        source: ``"<file>:<line>"`` (1-based record number) for error messages.
    """

    id: str
    token_ids: np.ndarray
    timestamp: float | None = None
    session_id: str | None = None
    cache_salt: str = ""
    output_length: int | None = None
    source: str = ""


TokenizerArg = str | Tokenizer
Reader = Callable[[Path, TokenizerArg], Iterator[Request]]

MOONCAKE_BLOCK_TOKENS = 512
#: synthesized Mooncake token ids are < this, so they are ordinary (non-special) cl100k_base ids.
MOONCAKE_VOCAB = 100_256
_MAX_HASH_ID = 2**55  # hash_id * 512 + 511 must fit in uint64
_GZIP_MAGIC = b"\x1f\x8b"


# --------------------------------------------------------------------------------------------- entry points

def read_trace(path: str | Path, fmt: str = "auto", tokenizer: TokenizerArg = DEFAULT_TOKENIZER) -> Iterator[Request]:
    """The requests of a trace file, in trace order, read lazily.

    Args:
        path: the trace file (optionally gzip-compressed).
        fmt: ``"auto"`` or one of :data:`FORMATS` (``native``, ``mooncake``, ``sharegpt``, ``swe-agent``).
        tokenizer: tokenizer name (or a loaded :class:`~kvcli.tokenize.Tokenizer`) for text prompts; loaded only
            when a record needs it (Mooncake and ``token_ids`` records never do).

    Returns:
        An iterator of :class:`Request`; record errors surface as it reaches them.

    Raises:
        BadInputError: unknown ``fmt``; file missing or unreadable; format not detectable; (while iterating) a bad
            record, with its line.
    """
    if fmt != "auto" and fmt not in FORMATS:
        raise BadInputError(f"unknown trace format {fmt!r}; valid formats: auto, {', '.join(FORMATS)}")
    path = Path(path)
    _check_file(path)
    if fmt == "auto":
        fmt = detect_format(path)
    return FORMATS[fmt](path, tokenizer)


def detect_format(path: str | Path) -> str:
    """The format name of a trace file, from its suffix and first record (see the module docstring).

    Raises:
        BadInputError: the file is missing, empty, not JSON, or its first record matches no format.
    """
    path = Path(path)
    _check_file(path)
    if _stem_and_suffix(path)[1] == ".traj":
        return "swe-agent"
    if _first_char(path) == b"[":
        return "sharegpt"
    line_no, record = _first_record(path)
    if not isinstance(record, dict):
        raise BadInputError(f"cannot detect the trace format: the first record is {_json_type(record)}, "
                            "not an object; pass the format by name", path=str(path), line=line_no)
    for key, fmt in (("hash_ids", "mooncake"), ("conversations", "sharegpt"), ("history", "swe-agent")):
        if key in record:
            return fmt
    if any(k in record for k in _NATIVE_PROMPT_KEYS):
        return "native"
    keys = ", ".join(sorted(record)[:10]) or "none"
    raise BadInputError(f"cannot detect the trace format from the first record's keys ({keys}); expected "
                        "hash_ids (mooncake), conversations (sharegpt), history (swe-agent) or "
                        "prompt/messages/token_ids (native)", path=str(path), line=line_no)


# --------------------------------------------------------------------------------------------- native

_NATIVE_PROMPT_KEYS = ("prompt", "messages", "token_ids")


def read_native(path: Path, tokenizer: TokenizerArg = DEFAULT_TOKENIZER) -> Iterator[Request]:
    """Requests of a native JSONL trace (format in the module docstring)."""
    for line_no, record in _iter_jsonl(path):
        try:
            request = _native_request(record, tokenizer, path, line_no)
        except BadInputError as err:
            raise _located(err, path, line_no) from None
        yield request


def _native_request(record: Any, tokenizer: TokenizerArg, path: Path, line_no: int) -> Request:
    record = _require_object(record)
    present = [k for k in _NATIVE_PROMPT_KEYS if k in record]
    if len(present) != 1:
        found = ", ".join(present) if present else "none"
        raise BadInputError(f"a native record needs exactly one of prompt, messages, token_ids (found: {found})")
    key = present[0]
    value = record[key]
    if key == "prompt":
        if not isinstance(value, str):
            raise BadInputError(f"prompt must be a string, not {type(value).__name__}")
        tokens = get_tokenizer(tokenizer).encode(value)
    elif key == "messages":
        if not isinstance(value, list):
            raise BadInputError(f"messages must be a list of chat messages, not {type(value).__name__}")
        tokens = get_tokenizer(tokenizer).encode_chat(value, add_generation_prompt=True)
    else:
        tokens = token_array(value)
    salt = record.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise BadInputError(f"cache_salt must be a string, not {type(salt).__name__}")
    return Request(
        id=_optional_id(record, "id") or f"{path.name}:{line_no}",
        token_ids=tokens,
        timestamp=_optional_seconds(record.get("timestamp"), "timestamp", divisor=1),
        session_id=_optional_id(record, "session_id"),
        cache_salt=salt or "",
        output_length=_optional_count(record.get("output_length"), "output_length"),
        source=f"{path}:{line_no}",
    )


def token_array(value: Any) -> np.ndarray:
    """Validated token ids: a list of integers in ``[0, 2**32)`` as a ``[tokens]`` ``'<u4'`` array.

    Raises:
        BadInputError: not a list, or an element that is not such an integer (its index is named).
    """
    if not isinstance(value, list):
        raise BadInputError(f"token_ids must be a list of integers, not {type(value).__name__}")
    if not value:
        return np.zeros(0, dtype=TOKEN_DTYPE)
    try:
        arr = np.array(value)
    except (ValueError, OverflowError, TypeError):
        arr = None
    if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu":
        bad = np.flatnonzero((arr < 0) | (arr > 0xFFFFFFFF))
        if not bad.size:
            return arr.astype(TOKEN_DTYPE)
        i = int(bad[0])
    else:
        i = next((i for i, t in enumerate(value) if type(t) is not int or not 0 <= t <= 0xFFFFFFFF), 0)
    raise BadInputError(f"token_ids[{i}] = {_short(value[i])} is not an integer in [0, 2**32)")


# --------------------------------------------------------------------------------------------- mooncake

def read_mooncake(path: Path, tokenizer: TokenizerArg = DEFAULT_TOKENIZER) -> Iterator[Request]:
    """Requests of a Mooncake JSONL trace; token ids synthesized by :func:`mooncake_token_ids`.

    ``tokenizer`` is not used (there is no text); the ids are valid ordinary cl100k_base ids.
    """
    del tokenizer
    for line_no, record in _iter_jsonl(path):
        try:
            request = _mooncake_request(record, path, line_no)
        except BadInputError as err:
            raise _located(err, path, line_no) from None
        yield request


def _mooncake_request(record: Any, path: Path, line_no: int) -> Request:
    record = _require_object(record)
    input_length = _optional_count(record.get("input_length"), "input_length")
    if input_length is None:
        raise BadInputError("a mooncake record needs input_length (an integer >= 0)")
    if "hash_ids" not in record:
        raise BadInputError("a mooncake record needs hash_ids (a list of block ids)")
    return Request(
        id=f"{path.name}:{line_no}",
        token_ids=mooncake_token_ids(record["hash_ids"], input_length),
        timestamp=_optional_seconds(record.get("timestamp"), "timestamp", divisor=1000),
        session_id=_optional_id(record, "session_id"),
        output_length=_optional_count(record.get("output_length"), "output_length"),
        source=f"{path}:{line_no}",
    )


def mooncake_token_ids(hash_ids: list[int], input_length: int) -> np.ndarray:
    """Deterministic token ids for a Mooncake request: equal hash ids give equal 512-token blocks.

    Token ``j`` (0 <= j < 512) of block ``b`` is ``((splitmix64(hash_ids[b] * 512 + j) >> 32) * 100256) >> 32``,
    all in wrapping uint64 arithmetic, where ``splitmix64`` is the output function of Vigna's SplitMix64::

        z = x + 0x9E3779B97F4A7C15
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        z = z ^ (z >> 31)

    (the high 32 bits of the mix, mapped onto ``[0, 100256)`` by multiply-shift -- Lemire's range reduction,
    uniform like ``% 100256`` but without a 64-bit division). The blocks are concatenated and cut to
    ``input_length`` tokens. Ids are < 100,256, i.e. ordinary (non-special) cl100k_base ids. Vectorized: no
    Python loop per block or token.

    Args:
        hash_ids: block ids, integers in ``[0, 2**55)``; ``len(hash_ids) * 512 >= input_length``.
        input_length: prompt length in tokens, >= 0.

    Returns:
        ``[input_length]`` ``'<u4'`` array.

    Raises:
        BadInputError: a hash id that is not such an integer, or too few blocks for ``input_length``.
    """
    if not isinstance(hash_ids, list):
        raise BadInputError(f"hash_ids must be a list of integers, not {type(hash_ids).__name__}")
    if len(hash_ids) * MOONCAKE_BLOCK_TOKENS < input_length:
        raise BadInputError(f"{len(hash_ids)} hash_ids cover {len(hash_ids) * MOONCAKE_BLOCK_TOKENS} tokens, "
                            f"fewer than input_length {input_length} ({MOONCAKE_BLOCK_TOKENS} tokens per block)")
    n_blocks = -(-input_length // MOONCAKE_BLOCK_TOKENS)
    blocks = _hash_id_array(hash_ids)[:n_blocks]
    x = (blocks[:, None] * np.uint64(MOONCAKE_BLOCK_TOKENS) + _BLOCK_OFFSETS).reshape(-1)[:input_length]
    x = _splitmix64_(x)
    x >>= _S32
    x *= _VOCAB
    x >>= _S32
    return x.astype(TOKEN_DTYPE)


_BLOCK_OFFSETS = np.arange(MOONCAKE_BLOCK_TOKENS, dtype=np.uint64)
_SM64_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_SM64_M1 = np.uint64(0xBF58476D1CE4E5B9)
_SM64_M2 = np.uint64(0x94D049BB133111EB)
_S27, _S30, _S31, _S32 = np.uint64(27), np.uint64(30), np.uint64(31), np.uint64(32)
_VOCAB = np.uint64(MOONCAKE_VOCAB)


def _hash_id_array(hash_ids: list) -> np.ndarray:
    try:
        arr = np.array(hash_ids) if hash_ids else np.zeros(0, dtype=np.int64)
    except (ValueError, OverflowError, TypeError):
        arr = None
    if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu":
        bad = np.flatnonzero((arr < 0) | (arr >= _MAX_HASH_ID))
        if not bad.size:
            return arr.astype(np.uint64)
        i = int(bad[0])
    else:
        i = next((i for i, h in enumerate(hash_ids) if type(h) is not int or not 0 <= h < _MAX_HASH_ID), 0)
    raise BadInputError(f"hash_ids[{i}] = {_short(hash_ids[i])} is not an integer in [0, 2**55)")


def _splitmix64_(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on a contiguous uint64 array, elementwise, wrapping, **in place**; returns ``x``."""
    x += _SM64_GAMMA
    x ^= x >> _S30
    x *= _SM64_M1
    x ^= x >> _S27
    x *= _SM64_M2
    x ^= x >> _S31
    return x


# --------------------------------------------------------------------------------------------- sharegpt

_SHAREGPT_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
    "system": "system",
    "function_call": "assistant",
    "observation": "tool", "tool": "tool",
}


def read_sharegpt(path: Path, tokenizer: TokenizerArg = DEFAULT_TOKENIZER) -> Iterator[Request]:
    """Requests of a ShareGPT file (JSON list, one object, or JSONL): one per assistant turn."""
    tok = get_tokenizer(tokenizer)
    for record_no, record in _iter_records(path):
        try:
            session_id, messages = _sharegpt_conversation(record, path, record_no)
            requests = _chat_requests(messages, tok, session_id, f"{path}:{record_no}")
        except BadInputError as err:
            raise _located(err, path, record_no) from None
        yield from requests


def _sharegpt_conversation(record: Any, path: Path, record_no: int) -> tuple[str, list[dict]]:
    """``(session_id, messages)`` of one ShareGPT conversation, roles mapped to chat roles."""
    record = _require_object(record)
    turns = record.get("conversations")
    if not isinstance(turns, list):
        raise BadInputError("a sharegpt record needs 'conversations', a list of {from, value} turns")
    session_id = (_optional_id(record, "id") or _optional_id(record, "conversation_id")
                  or f"{path.name}#{record_no}")
    messages = []
    system, tools = record.get("system"), record.get("tools")
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    if tools and not isinstance(tools, str):
        tools = json.dumps(tools, ensure_ascii=False)
    if isinstance(tools, str) and tools.strip() not in ("", "[]"):
        messages.append({"role": "system", "content": "Tools available:\n" + tools})
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise BadInputError(f"conversations[{i}] must be an object with from and value")
        speaker, value = turn.get("from", turn.get("role")), turn.get("value", turn.get("content"))
        role = _SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise BadInputError(f"conversations[{i}].from = {_short(speaker)} is not one of "
                                f"{', '.join(_SHAREGPT_ROLES)}")
        if not isinstance(value, str):
            raise BadInputError(f"conversations[{i}].value must be a string, not {type(value).__name__}")
        messages.append({"role": role, "content": value})
    return session_id, messages


# --------------------------------------------------------------------------------------------- swe-agent

def read_swe_agent(path: Path, tokenizer: TokenizerArg = DEFAULT_TOKENIZER) -> Iterator[Request]:
    """Requests of a SWE-agent ``.traj`` file: one per assistant message (an LLM call)."""
    tok = get_tokenizer(tokenizer)
    document = _load_json(path)
    history = document.get("history") if isinstance(document, dict) else None
    if not isinstance(history, list):
        raise BadInputError("a swe-agent trajectory must be a JSON object with a 'history' list of messages",
                            path=str(path))
    stem = _stem_and_suffix(path)[0]
    try:
        requests = _chat_requests(history, tok, stem, str(path), per_agent=True)
    except _MessageError as err:
        raise BadInputError(f"history[{err.index}]: {err.reason}", path=str(path), line=err.index + 1) from None
    yield from requests


# --------------------------------------------------------------------------------------------- chat -> requests

class _MessageError(Exception):
    """A bad message at ``index`` of a message list (internal; turned into a located BadInputError)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index, self.reason = index, reason


def _chat_requests(messages: list, tok: Tokenizer, session_id: str, source: str,
                   per_agent: bool = False) -> list[Request]:
    """One request per assistant message: prompt = the earlier messages + generation prompt.

    Each message is encoded once (header, text, footer separately), so prompts are exact token prefixes of
    later prompts. With ``per_agent`` the history is kept per ``message["agent"]`` (SWE-agent), and messages
    with ``is_demo`` are context only. ``source`` gets ``:<index + 1>`` appended when ``per_agent``.

    Raises:
        BadInputError (plain lists) / _MessageError (``per_agent``): a bad message.
    """
    histories: dict[Any, list[np.ndarray]] = {}
    requests = []
    for index, message in enumerate(messages):
        try:
            role, text_ids = message_role(message), tok.encode(message_text(message))
        except BadInputError as err:
            if per_agent:
                raise _MessageError(index, err.reason) from None
            raise BadInputError(f"message {index + 1}: {err.reason}") from None
        history = histories.setdefault(message.get("agent") if per_agent else None, [])
        if role == "assistant" and not (per_agent and message.get("is_demo")):
            k = len(requests) + 1
            requests.append(Request(
                id=f"{session_id}:{k}",
                token_ids=np.concatenate(history + [tok.generation_prompt]),
                session_id=session_id,
                output_length=len(text_ids),
                source=f"{source}:{index + 1}" if per_agent else source,
            ))
        history.append(np.concatenate((tok.header(role), text_ids, tok.footer)))
    return requests


# --------------------------------------------------------------------------------------------- field helpers

def _require_object(record: Any) -> dict:
    if not isinstance(record, dict):
        raise BadInputError(f"expected a JSON object, got {_json_type(record)}")
    return record


def _optional_id(record: dict, key: str) -> str | None:
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise BadInputError(f"{key} must be a string or an integer, not {_json_type(value)}")
    return str(value)


def _optional_count(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise BadInputError(f"{key} must be an integer >= 0, got {_short(value)}")
    return value


def _optional_seconds(value: Any, key: str, divisor: int) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise BadInputError(f"{key} must be a finite number >= 0, got {_short(value)}")
    return float(value) / divisor


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _located(err: BadInputError, path: Path, line: int) -> BadInputError:
    """``err`` again, located at ``path:line`` (unless it already has a location)."""
    if err.path:
        return err
    return BadInputError(err.reason, path=str(path), line=line)


# --------------------------------------------------------------------------------------------- file helpers

def _check_file(path: Path) -> None:
    if not path.exists():
        raise BadInputError("file not found", path=str(path))
    if not path.is_file():
        raise BadInputError("not a regular file", path=str(path))


def _stem_and_suffix(path: Path) -> tuple[str, str]:
    """``(stem, suffix)`` of ``path`` with a trailing ``.gz`` removed first: ``a.traj.gz`` -> ``("a", ".traj")``."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    p = Path(name)
    return p.stem, p.suffix


def _open_binary(path: Path) -> BinaryIO:
    """``path`` opened for reading bytes, through gzip when it starts with the gzip magic bytes."""
    try:
        with open(path, "rb") as raw:
            magic = raw.read(2)
        return gzip.open(path, "rb") if magic == _GZIP_MAGIC else open(path, "rb")
    except OSError as exc:
        raise BadInputError(f"cannot open: {exc.strerror or exc}", path=str(path)) from None


_READ_ERRORS = (OSError, EOFError, zlib.error)
_UTF8_BOM = b"\xef\xbb\xbf"


def _read_error(exc: Exception) -> str:
    return f"cannot read ({type(exc).__name__}: {exc})"


def _iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line_no, line)`` for each non-blank line (bytes; decoded by the JSON parser), 1-based, streamed."""
    line_no = 0
    try:
        with _open_binary(path) as f:
            for line_no, line in enumerate(f, 1):
                if line.strip():
                    yield line_no, line
    except _READ_ERRORS as exc:
        raise BadInputError(_read_error(exc), path=str(path), line=line_no + 1) from None


def _first_line(path: Path) -> tuple[int, bytes] | None:
    """``(line_no, line)`` of the first non-blank line, or None for a blank file."""
    with contextlib.closing(_iter_lines(path)) as lines:
        return next(lines, None)


def _parse_line(path: Path, line_no: int, line: bytes) -> Any:
    """The JSON value of one line (UTF-8; a BOM is allowed).

    Raises:
        BadInputError: at ``path:line_no``, invalid JSON or not UTF-8.
    """
    try:
        return json.loads(line)
    except RecursionError:
        raise BadInputError("JSON nested too deeply", path=str(path), line=line_no) from None
    except json.JSONDecodeError as exc:
        raise BadInputError(f"invalid JSON: {exc.msg} (column {exc.colno})", path=str(path), line=line_no) from None
    except UnicodeDecodeError as exc:
        raise BadInputError(f"not UTF-8 text ({exc.reason} at byte {exc.start + 1} of the line)",
                            path=str(path), line=line_no) from None


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line_no, value)`` of each non-blank line of a JSONL file, streamed."""
    for line_no, line in _iter_lines(path):
        yield line_no, _parse_line(path, line_no, line)


def _load_json(path: Path) -> Any:
    """The single JSON value of a file (loaded whole)."""
    try:
        with _open_binary(path) as f:
            return json.load(f)
    except RecursionError:
        raise BadInputError("JSON nested too deeply", path=str(path)) from None
    except json.JSONDecodeError as exc:
        raise BadInputError(f"invalid JSON: {exc.msg} (column {exc.colno})", path=str(path),
                            line=exc.lineno) from None
    except UnicodeDecodeError as exc:
        raise BadInputError(f"not UTF-8 text ({exc.reason} at byte {exc.start + 1})", path=str(path)) from None
    except _READ_ERRORS as exc:
        raise BadInputError(_read_error(exc), path=str(path)) from None


def _first_char(path: Path) -> bytes | None:
    """The first non-whitespace byte of the file, after any UTF-8 BOM (reads a few KiB at a time), or None."""
    try:
        with _open_binary(path) as f:
            chunk = f.read(4096)
            if chunk.startswith(_UTF8_BOM):
                chunk = chunk[len(_UTF8_BOM):]
            while chunk:
                stripped = chunk.lstrip()
                if stripped:
                    return stripped[:1]
                chunk = f.read(4096)
    except _READ_ERRORS as exc:
        raise BadInputError(_read_error(exc), path=str(path)) from None
    return None


def _is_json_document(path: Path) -> bool:
    """True when the file is one JSON value rather than JSONL: it starts with ``[`` or with a lone ``{`` line."""
    if _first_char(path) == b"[":
        return True
    first = _first_line(path)
    return first is not None and first[1].strip().removeprefix(_UTF8_BOM) == b"{"


def _first_record(path: Path) -> tuple[int, Any]:
    """``(line_no, value)`` of the first record: the first non-blank JSONL line, or the whole JSON document."""
    if _is_json_document(path):
        return 1, _load_json(path)
    first = _first_line(path)
    if first is None:
        raise BadInputError("empty file: no records, so no format to detect", path=str(path))
    return first[0], _parse_line(path, *first)


def _iter_records(path: Path) -> Iterator[tuple[int, Any]]:
    """``(record_no, value)``: the elements of a JSON list (1-based index), a JSON object as record 1, or the
    lines of a JSONL file (1-based line)."""
    if not _is_json_document(path):
        yield from _iter_jsonl(path)
        return
    document = _load_json(path)
    if isinstance(document, list):
        yield from enumerate(document, 1)
    else:
        yield 1, document


#: format name -> reader ``(path, tokenizer) -> Iterator[Request]``.
FORMATS: dict[str, Reader] = {
    "native": read_native,
    "mooncake": read_mooncake,
    "sharegpt": read_sharegpt,
    "swe-agent": read_swe_agent,
}
