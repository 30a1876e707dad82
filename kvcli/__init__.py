"""kvcli: how much prefill would a chunk-hash KV cache save on your traffic, at which chunk size, at what cost.

Subpackages follow the data flow (README, "Architecture"): traces -> model (tokenize) -> store (chunks, prefix
hashes, Redis) -> model (prefill) -> replay (report); live (warm, inspect) and route are the other commands; cli is
the thin typer layer. units.py and errors.py are shared by all.

The library the CLI is built on: the names a notebook needs are importable from ``kvcli`` itself (each loaded on
first use, so ``import kvcli`` costs nothing). docs/library.md walks through them; its example runs in the tests.

* traces: :func:`read_trace` (a trace file's :class:`Request` objects; a hash-id trace's are :class:`HashIdRequest`),
  :func:`read_prompts` (warm's sources);
* a server: :func:`open_redis` (a URL, ``$REDIS_URL``, or an embedded server for the block);
* replay: :class:`ReplayConfig`, :class:`ModelOptions`, :func:`run_replay` -> :class:`TraceResult` per trace, one
  :class:`ChunkSizeResult` per chunk size;
* the store: :class:`ChunkStore` and its :class:`StoreConfig` (lookup, retrieve, store), :func:`judge` (the one
  chunk judge);
* a live cache: :func:`warm` with :class:`WarmConfig` and :func:`load_model`, :func:`inspect_cache`,
  :func:`chunk_map`, :func:`count` and :func:`purge` (one namespace's keys);
* errors: :class:`KvcliError` and its family (``exit_code`` for each).
"""
from __future__ import annotations

import importlib

from kvcli.version import __version__

# typing.TYPE_CHECKING, without importing typing (7 ms): what `import kvcli` runs before kvcli/__main__.py's guard
# against a Ctrl-C is kept to this file and kvcli.version
TYPE_CHECKING = False

_EXPORTS = {
    "read_trace": "kvcli.traces.detect",
    "read_prompts": "kvcli.traces.prompts",
    "Request": "kvcli.traces.request",
    "HashIdRequest": "kvcli.traces.request",
    "open_redis": "kvcli.store.server",
    "ReplayConfig": "kvcli.replay.results",
    "TraceResult": "kvcli.replay.results",
    "ChunkSizeResult": "kvcli.replay.results",
    "ModelOptions": "kvcli.replay.runner",
    "run_replay": "kvcli.replay.runner",
    "ChunkStore": "kvcli.store.chunkstore",
    "StoreConfig": "kvcli.store.records",
    "judge": "kvcli.store.judge",
    "warm": "kvcli.live.warm",
    "WarmConfig": "kvcli.live.warm",
    "load_model": "kvcli.model.load",
    "inspect_cache": "kvcli.live.inspect",
    "chunk_map": "kvcli.live.chunkmap",
    "count": "kvcli.store.namespace",
    "purge": "kvcli.store.namespace",
    "KvcliError": "kvcli.errors",
    "BadInputError": "kvcli.errors",
    "RedisFailure": "kvcli.errors",
    "ModelFailure": "kvcli.errors",
}
__all__ = [  # the names of _EXPORTS, spelled out for linters and editors (a test checks they agree)
    "__version__", "read_trace", "read_prompts", "Request", "HashIdRequest", "open_redis", "ReplayConfig",
    "TraceResult",
    "ChunkSizeResult", "ModelOptions", "run_replay", "ChunkStore", "StoreConfig", "judge", "warm", "WarmConfig",
    "load_model", "inspect_cache", "chunk_map", "count", "purge", "KvcliError", "BadInputError", "RedisFailure",
    "ModelFailure",
]

if TYPE_CHECKING:  # what a type checker and an editor see; at run time each name loads on first use
    from kvcli.errors import BadInputError, KvcliError, ModelFailure, RedisFailure
    from kvcli.live.chunkmap import chunk_map
    from kvcli.live.inspect import inspect_cache
    from kvcli.live.warm import WarmConfig, warm
    from kvcli.model.load import load_model
    from kvcli.replay.results import ChunkSizeResult, ReplayConfig, TraceResult
    from kvcli.replay.runner import ModelOptions, run_replay
    from kvcli.store.chunkstore import ChunkStore
    from kvcli.store.judge import judge
    from kvcli.store.namespace import count, purge
    from kvcli.store.records import StoreConfig
    from kvcli.store.server import open_redis
    from kvcli.traces.detect import read_trace
    from kvcli.traces.prompts import read_prompts
    from kvcli.traces.request import HashIdRequest, Request


def __getattr__(name: str):
    """``kvcli.read_trace`` and the other names of :data:`__all__`, imported from their module on first use.

    Raises:
        AttributeError: not a name of kvcli's library.
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvcli' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
