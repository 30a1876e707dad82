"""A running OpenAI-compatible serving engine (vLLM, or another of that API) seen through its HTTP API: what it
says it is (:meth:`EngineClient.info`) and one streamed completion, timed to its first token
(:meth:`EngineClient.complete`).

Endpoints read: ``GET /v1/models`` (served models, ``owned_by`` names the engine, ``max_model_len``), ``GET
/version`` (``{"version": ...}``), ``GET /metrics`` (vLLM's ``vllm:cache_config_info`` labels: ``block_size``,
``enable_prefix_caching``, ``cache_dtype``), and ``POST /v1/completions`` with ``prompt`` as a list of token ids,
``max_tokens`` 1, ``stream`` and ``stream_options.include_usage``: the last chunk's usage gives the prompt tokens and
``prompt_tokens_details.cached_tokens`` (vLLM: ``--enable-prompt-tokens-details``). ``/version`` and ``/metrics``
are optional: where they do not answer, the fields they give are None.

HTTP through httpx2, without proxies from the environment (an engine on loopback must not go through one). An API
key, where the engine wants one, comes from ``$KVCLI_ENGINE_API_KEY`` (a Bearer token), never from the command
line, so it is in no saved ``command_line``.
"""
from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2

from kvcli.errors import BadInputError, EngineFailure, one_line

API_KEY_ENV = "KVCLI_ENGINE_API_KEY"
CONNECT_TIMEOUT_SECONDS = 5.0
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_START_HINT = ("start one with: vllm serve MODEL --enable-prefix-caching --enable-prompt-tokens-details "
               "(or python -m vllm.entrypoints.openai.api_server --model MODEL ...)")


@dataclass(frozen=True)
class EngineInfo:
    """What an engine says about itself (None where it does not say).

    Attributes:
        url: the engine's root URL without credentials, query or fragment (:func:`public_url`).
        name: the engine, as ``/v1/models`` names the served model's owner (vLLM: ``"vllm"``).
        version: ``GET /version``'s ``version``. served_model: the model id requests name.
        max_model_len: the longest sequence it serves, prompt + generated tokens.
        block_size: tokens per KV block, the unit a prefix hit is counted in (vLLM's ``/metrics``).
        prefix_caching: whether prefix caching is on (vLLM's ``/metrics``). kv_cache_dtype: its KV cache's dtype
            (``"auto"``: the model's).
    """

    url: str
    name: str | None
    version: str | None
    served_model: str
    max_model_len: int | None
    block_size: int | None
    prefix_caching: bool | None
    kv_cache_dtype: str | None

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"url": self.url, "name": self.name, "version": self.version, "served_model": self.served_model,
                "max_model_len": self.max_model_len, "block_size": self.block_size,
                "prefix_caching": self.prefix_caching, "kv_cache_dtype": self.kv_cache_dtype}


@dataclass(frozen=True)
class Completion:
    """One streamed completion: ``ttft_seconds`` from sending the request to the first chunk carrying a choice
    (wall clock, ``time.perf_counter``), the usage's ``prompt_tokens``, and its
    ``prompt_tokens_details.cached_tokens`` (None: the usage has no such detail)."""

    ttft_seconds: float
    prompt_tokens: int
    cached_tokens: int | None


def public_url(url: str) -> str:
    """``url``'s root as it may be printed and saved: scheme, host, port and path, without credentials, query,
    fragment, trailing ``/`` or a trailing ``/v1`` (``http://key@host:8000/v1/`` -> ``http://host:8000``).

    Raises:
        BadInputError: not an ``http://`` or ``https://`` URL with a host.
    """
    try:
        parts = urlsplit(url.strip())
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise BadInputError(f"--engine: not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not host:
        raise BadInputError("--engine takes the engine's http:// or https:// URL, e.g. http://127.0.0.1:8000")
    netloc = f"[{host}]" if ":" in host else host
    path = parts.path.rstrip("/").removesuffix("/v1").rstrip("/")
    return urlunsplit((parts.scheme, netloc + (f":{port}" if port is not None else ""), path, "", ""))


class EngineClient:
    """HTTP to one engine, one connection kept open (so a timed request pays no connection set-up).

    Args:
        url: the engine's URL (``http://127.0.0.1:8000``; a trailing ``/v1`` is taken off; credentials in it
            are sent as HTTP basic auth, never printed).
        timeout: seconds a request may wait for each read (a long prefill on a slow device needs minutes).
        api_key: a Bearer token (None: ``$KVCLI_ENGINE_API_KEY`` when set).

    Raises:
        BadInputError: ``url`` is not an http(s) URL.
    """

    def __init__(self, url: str, timeout: float = 600.0, api_key: str | None = None) -> None:
        self.url = public_url(url)
        parts = urlsplit(url.strip())
        auth = (parts.username or "", parts.password or "") if parts.username or parts.password else None
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self._http = httpx2.Client(
            base_url=self.url, auth=auth, trust_env=False, headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=httpx2.Timeout(timeout, connect=CONNECT_TIMEOUT_SECONDS))

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection."""
        self._http.close()

    def info(self, served_model: str | None = None) -> EngineInfo:
        """What the engine serves and says about itself (module docstring).

        Args:
            served_model: the model id to use; None: the first one ``/v1/models`` lists.

        Raises:
            EngineFailure: unreachable, or ``/v1/models`` is not an OpenAI model list (not an OpenAI-compatible
                server). BadInputError: ``served_model`` is not among the served models (the message lists them).
        """
        models = self._models()
        ids = [str(m.get("id")) for m in models]
        if served_model is not None and served_model not in ids:
            raise BadInputError(f"--served-model {served_model}: the engine at {self.url} serves {', '.join(ids)}")
        model = models[ids.index(served_model)] if served_model is not None else models[0]
        cache = self._cache_config()
        max_len = model.get("max_model_len")
        return EngineInfo(
            url=self.url, name=_text(model.get("owned_by")), version=self._version(), served_model=str(model["id"]),
            max_model_len=max_len if isinstance(max_len, int) and max_len > 0 else None,
            block_size=_int(cache.get("block_size")),
            prefix_caching={"True": True, "False": False}.get(cache.get("enable_prefix_caching", "")),
            kv_cache_dtype=cache.get("cache_dtype"))

    def complete(self, served_model: str, token_ids: Sequence[int]) -> Completion:
        """Stream a completion of ``token_ids`` (one generated token, greedy) and time its first token.

        Raises:
            EngineFailure: unreachable; an HTTP error (the engine's message, e.g. a token id out of its
                vocabulary, a prompt longer than it serves); an error in the stream; no chunk with a choice; no
                usage in the stream (the engine ignores ``stream_options.include_usage``).
        """
        body = {"model": served_model, "prompt": list(token_ids), "max_tokens": 1, "temperature": 0.0,
                "stream": True, "stream_options": {"include_usage": True}}
        ttft, usage = None, None
        with self._call(f"POST /v1/completions of {len(token_ids):,} token ids"):
            start = time.perf_counter()
            with self._http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise EngineFailure(self._http_error("POST /v1/completions", response))
                for chunk in _sse_data(response.iter_lines()):
                    if ttft is None and chunk.get("choices"):
                        ttft = time.perf_counter() - start
                    if isinstance(chunk.get("usage"), dict):
                        usage = chunk["usage"]
        if ttft is None:
            raise EngineFailure(f"the engine at {self.url} streamed no token for a completion (POST /v1/completions)")
        if usage is None or not isinstance(usage.get("prompt_tokens"), int):
            raise EngineFailure(f"the engine at {self.url} streams no usage with stream_options.include_usage; "
                                "kvcli needs its prompt and cached token counts")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return Completion(ttft, usage["prompt_tokens"], cached if isinstance(cached, int) else None)

    # -- requests ----------------------------------------------------------------------------------------------
    def _models(self) -> list[dict]:
        with self._call("GET /v1/models"):
            response = self._http.get("/v1/models")
        if response.status_code in (401, 403):
            raise EngineFailure(self._http_error("GET /v1/models", response))
        try:
            data = response.json()["data"] if response.status_code == 200 else None
        except (ValueError, KeyError, TypeError):
            data = None
        if not isinstance(data, list) or not data or not all(isinstance(m, dict) and "id" in m for m in data):
            what = f"answered {response.status_code}" if response.status_code != 200 else "gave no model list"
            raise EngineFailure(f"{self.url} is not an OpenAI-compatible engine: GET /v1/models {what}")
        return data

    def _version(self) -> str | None:
        with self._call("GET /version"):
            response = self._http.get("/version")
        try:
            version = response.json().get("version") if response.status_code == 200 else None
        except (ValueError, AttributeError):
            return None
        return _text(version)

    def _cache_config(self) -> dict[str, str]:
        """vLLM's ``vllm:cache_config_info`` labels (``{}`` where ``/metrics`` has none)."""
        with self._call("GET /metrics"):
            response = self._http.get("/metrics")
        if response.status_code != 200:
            return {}
        for line in response.text.splitlines():
            if line.startswith("vllm:cache_config_info{"):
                return {k: v for k, v in _LABEL.findall(line)}
        return {}

    def _call(self, what: str) -> _Translate:
        """A ``with`` block whose transport errors become one-line EngineFailure (:class:`_Translate`)."""
        return _Translate(self.url, what)

    def _http_error(self, what: str, response: httpx2.Response) -> str:
        key = (f"; the engine wants an API key: set ${API_KEY_ENV}" if response.status_code in (401, 403) else "")
        return f"the engine at {self.url}: {what} answered {response.status_code}: {_message(response)}{key}"


class _Translate:
    """Turns httpx2's transport errors inside a ``with`` into one-line :class:`EngineFailure` naming the URL and
    the request (never the credentials: the URL is the public one)."""

    def __init__(self, url: str, what: str) -> None:
        self.url, self.what = url, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> None:
        if isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout)):
            raise EngineFailure(f"cannot reach the engine at {self.url} ({_reason(exc)}); is it running? "
                                f"{_START_HINT}") from None
        if isinstance(exc, httpx2.TimeoutException):
            raise EngineFailure(f"the engine at {self.url} did not answer {self.what} in time ({_reason(exc)})") \
                from None
        if isinstance(exc, httpx2.HTTPError):
            raise EngineFailure(f"the engine at {self.url} failed {self.what}: {_reason(exc)}") from None


def _sse_data(lines: Iterable[str]) -> Iterator[dict]:
    """The JSON objects of a server-sent event stream's ``data:`` lines, up to ``[DONE]``.

    Raises:
        EngineFailure: a data line that is not a JSON object, or an ``error`` object in the stream.
    """
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise EngineFailure(f"the engine's stream is not JSON: {one_line(data[:200])}") from None
        if not isinstance(chunk, dict):
            raise EngineFailure(f"the engine's stream is not JSON objects: {one_line(data[:200])}")
        if chunk.get("error"):
            raise EngineFailure(f"the engine's stream reported an error: {_error_text(chunk['error'])}")
        yield chunk


def _message(response: httpx2.Response) -> str:
    """The error message of an engine's error response (OpenAI's ``{"error": {"message"}}``, FastAPI's
    ``{"detail"}``), else the start of its body; one line."""
    try:
        doc = response.json()
    except ValueError:
        return one_line(" ".join(response.text.split())[:300]) or response.reason_phrase
    if isinstance(doc, dict):
        for key in ("error", "detail", "message"):
            if doc.get(key):
                return _error_text(doc[key])
    return one_line(json.dumps(doc)[:300])


def _error_text(error: Any) -> str:
    text = error.get("message", error) if isinstance(error, dict) else error
    text = " ".join(str(text).split())
    return one_line(text[:300] + ("..." if len(text) > 300 else ""))


def _reason(exc: BaseException) -> str:
    return one_line(" ".join(str(exc).split())) or type(exc).__name__


def _text(value: Any) -> str | None:
    return str(value) if isinstance(value, (str, int, float)) and str(value) else None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() and int(value) > 0 else None
