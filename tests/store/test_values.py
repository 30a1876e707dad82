"""Every value kvcli hands to redis-py is a flat byte buffer, written whole: multi-dimensional and non-contiguous
tensors through every writer (kvcli's store, both of its write paths; the LMCache layout; warm), read back with
STRLEN and GET on a single server and on the cluster.

redis-py announces ``len(value)`` as a value's length, and a memoryview's ``len()`` is its first dimension: a
``[2, 3, 4]`` byte buffer was stored as 2 bytes and the other 22 were sent to the server as further commands.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kvcli.live.warm import WarmConfig, make_stores, warm
from kvcli.model.llama import build_model
from kvcli.model.presets import model_spec
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.lmcache import to_kv_2ltd
from kvcli.store.lmcache_store import LMCacheStore
from kvcli.store.records import StoreConfig
from kvcli.store.serde import decode_kv, flat_bytes
from kvcli.traces.request import Request

GRID = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
# (what, value, its bytes in C order): the value as a caller might hand it over
BUFFERS = [
    ("3-D uint8 memoryview", GRID.data, GRID.tobytes()),
    ("3-D uint8 array", GRID, GRID.tobytes()),
    ("strided memoryview", GRID[:, ::2].data, GRID[:, ::2].tobytes()),
    ("transposed array", GRID.T, np.ascontiguousarray(GRID.T).tobytes()),
    ("float32 memoryview", np.arange(6, dtype=np.float32).reshape(2, 3).data,
     np.arange(6, dtype=np.float32).tobytes()),
    ("permuted bf16 tensor", torch.arange(24, dtype=torch.bfloat16).reshape(2, 3, 4).permute(2, 0, 1),
     torch.arange(24, dtype=torch.bfloat16).reshape(2, 3, 4).permute(2, 0, 1).contiguous().view(torch.uint8)
     .numpy().tobytes()),
    ("bytes", b"\x00\r\n*1\r\n", b"\x00\r\n*1\r\n"),
    ("bytearray", bytearray(b"abc"), b"abc"),
    ("empty 2-D array", np.zeros((0, 3), dtype=np.float32), b""),
]


@pytest.mark.parametrize("what, value, expect", BUFFERS, ids=[b[0] for b in BUFFERS])
def test_flat_bytes_are_written_whole(redis_client, what, value, expect):
    flat = flat_bytes(value)
    assert len(flat) == len(expect)
    assert not isinstance(flat, memoryview) or (flat.ndim, flat.format, flat.c_contiguous) == (1, "B", True)
    redis_client.set("v", flat)
    assert redis_client.strlen("v") == len(expect)
    assert redis_client.get("v") == expect
    assert redis_client.dbsize() == 1  # nothing of the value was read as a command


@pytest.mark.parametrize("value", ["text", 3, None, [1, 2]])
def test_flat_bytes_refuses_what_is_not_a_buffer(value):
    with pytest.raises(TypeError, match="not a byte buffer"):
        flat_bytes(value)


def strided_kv(tokens: int, shape=(2, 2, 3), dtype=torch.bfloat16) -> torch.Tensor:
    """``[layers, 2, kv_heads, tokens, head_dim]`` (``shape`` = layers, kv_heads, head_dim) laid out token-major,
    so every chunk of it is a non-contiguous view; values distinct per element."""
    layers, heads, dim = shape
    n = tokens * layers * 2 * heads * dim
    base = (torch.arange(n, dtype=torch.float32) % 251).to(dtype).reshape(tokens, layers, 2, heads, dim)
    kv = base.permute(1, 2, 3, 0, 4)
    assert not kv.is_contiguous()
    return kv


def chunk_bytes(kv: torch.Tensor) -> bytes:
    return kv.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("dtype, kv_dtype", [(torch.bfloat16, None), (torch.float32, None),
                                             (torch.bfloat16, "float8_e4m3fn")])
@pytest.mark.parametrize("path", ["pipelined", "after a lookup"])
def test_chunk_store_writes_strided_kv_whole(redis_client, dtype, kv_dtype, path):
    config = StoreConfig("vals", 4, "m", "raw", (2, 2, 2, 3), dtype, kv_dtype=kv_dtype)
    store = ChunkStore(redis_client, config)
    tokens = list(range(1, 14))  # 3 full chunks
    kv = strided_kv(13, dtype=dtype)
    lookup = store.lookup(tokens) if path == "after a lookup" else None
    store.store(tokens, kv, lookup=lookup)
    prompt = store.chunk(tokens)
    value_bytes = config.header_bytes + config.payload_bytes
    assert value_bytes == store.value_bytes
    for k in range(3):
        key = store.payload_key(prompt.hashes[k])
        assert redis_client.strlen(key) == value_bytes
        decoded = decode_kv(redis_client.get(key), dtype)[0]
        chunk = kv[:, :, :, 4 * k:4 * k + 4, :]
        if kv_dtype is None:
            assert chunk_bytes(decoded) == chunk_bytes(chunk)
        else:
            assert decoded.shape == chunk.shape
    st = store.stats
    assert st.payload_bytes_written + st.header_bytes_written == 3 * value_bytes
    got = store.retrieve(tokens)
    assert got.hit_tokens == 12
    if kv_dtype is None:
        assert chunk_bytes(got.kv) == chunk_bytes(kv[:, :, :, :12, :])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_lmcache_store_writes_strided_kv_whole(redis_client, dtype):
    config = StoreConfig("vals", 4, "m", "raw", (2, 2, 2, 3), dtype)
    store = LMCacheStore(redis_client, config)
    tokens = list(range(1, 14))
    kv = strided_kv(13, dtype=dtype)
    store.store(tokens, kv)
    prompt = store.chunk(tokens)
    # [2, layers, tokens, kv_heads * head_dim]: 2 * 2 * 4 * 6 elements
    kv_bytes = 2 * 2 * 4 * 6 * dtype.itemsize
    for k in range(3):
        key = store.payload_key(prompt.hashes[k])
        assert redis_client.strlen(key) == kv_bytes
        assert redis_client.get(key) == chunk_bytes(to_kv_2ltd(kv[:, :, :, 4 * k:4 * k + 4, :]))
    assert store.stats.payload_bytes_written == 3 * kv_bytes
    got = store.retrieve(tokens)
    assert got.hit_tokens == 12 and chunk_bytes(got.kv) == chunk_bytes(kv[:, :, :, :12, :])
    assert redis_client.dbsize() == 6  # 3 chunks x (kv_bytes, metadata): no key made of tensor bytes


@pytest.fixture(scope="module")
def tiny_model():
    return build_model("tiny", device="cpu")


def test_warm_writes_the_models_kv_whole(redis_client, tiny_model):
    tokens = list(range(1, 41))  # 2 full chunks of 16: slices of the prefill's cache along its token axis
    config = WarmConfig("vals", (16,))
    result = warm(redis_client, [Request("r", np.asarray(tokens, dtype=np.uint32))], tiny_model, config)
    assert result.total("chunks_written") == 2
    store = make_stores(redis_client, model_spec("tiny"), config)[0]
    prompt = store.chunk(tokens)
    for k in range(2):
        assert redis_client.strlen(store.payload_key(prompt.hashes[k])) == store.value_bytes
    assert result.per_size[0].bytes == 2 * store.value_bytes + sum(
        redis_client.strlen(store.meta_key(prompt.hashes[k])) for k in range(2))
    assert redis_client.dbsize() == 4  # 2 chunks x (payload, metadata)
    assert store.lookup(tokens).hit_tokens == 32
