"""Shared fixtures: private Redis-compatible servers on free loopback ports (never the machine's own 6379)."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from kvcli.store.server import embedded_server


@pytest.fixture(scope="session")
def _session_server():
    with embedded_server() as url:
        yield url


@pytest.fixture
def redis_url(_session_server):
    """URL of a private embedded server, emptied before each test (it is ours, so FLUSHALL is allowed here)."""
    client = redis.Redis.from_url(_session_server)
    client.flushall()
    client.close()
    return _session_server


@pytest.fixture
def redis_client(redis_url):
    """A redis-py client on the private server of :func:`redis_url`."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def make_server():
    """Factory: ``make_server(**config) -> url`` starts one more private server with settings; all stop at teardown."""
    stack = contextlib.ExitStack()

    def start(**config: str) -> str:
        return stack.enter_context(embedded_server(**config))

    with stack:
        yield start


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A tiny random Llama checkpoint folder with its own tokenizer and Llama-3-style chat template (2 layers,
    2 KV heads of 16, fp32, 512-row vocabulary, seed 0), written at test time: nothing is downloaded."""
    from kvcli.model.hf_tiny import write_tiny_checkpoint

    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-a"), vocab=512, seed=0))


@pytest.fixture(scope="session")
def tiny_checkpoint_b(tmp_path_factory):
    """The same as :func:`tiny_checkpoint` with weight seed 1: same config.json and file sizes, other weights."""
    from kvcli.model.hf_tiny import write_tiny_checkpoint

    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-b"), vocab=512, seed=1))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
# tests share helpers across folders (e.g. test_inspect's read-only check): every test folder is importable, so any
# one folder or file runs on its own
sys.path[1:1] = [str(d) for d in sorted(Path(__file__).resolve().parent.iterdir()) if d.is_dir() and d.name[0] != "_"]
from faultproxy import FaultProxy  # noqa: E402  (bench/faultproxy.py: shared with bench/bench_faults.py)


@pytest.fixture
def fault_proxy(redis_url):
    """A :class:`FaultProxy` in front of the private server of :func:`redis_url` (``proxy.url()``; rules via
    ``proxy.drop(...)`` / ``proxy.stall(...)``); closed at teardown, and after 300 s at most."""
    parts = urlsplit(redis_url)
    with FaultProxy(parts.hostname, parts.port) as proxy:
        yield proxy
