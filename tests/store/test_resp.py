"""RESP packing without Python work per key (kvcli.store.resp): byte for byte redis-py's own packing, and the
server's reading of it."""
from __future__ import annotations

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.store.resp import bulk, command, hash_keys, unlink_hashes

HEAD = "kvcli:v1:ns:16:m:"


def _redis_py(*args) -> bytes:
    """redis-py's packing of one command (its Python packer: the reference)."""
    return b"".join(redis.connection.PythonRespSerializer(65536, redis.connection.Encoder("utf-8", "strict", False)
                                                           .encode).pack(*args))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(min_size=16, max_size=16), max_size=40), st.text(max_size=12),
       st.lists(st.integers(0, 10 ** 9), max_size=5))
def test_an_eval_packed_here_is_redis_pys_bytes(hashes, head, counts):
    joined = b"".join(hashes)
    keys = [head + h.hex() for h in hashes]
    ours = command(3 + len(keys) + len(counts), bulk(b"EVAL"), bulk("return 1"), bulk(len(keys)),
                   hash_keys(head, joined), *map(bulk, counts))
    assert ours == _redis_py("EVAL", "return 1", len(keys), *keys, *counts)


def test_hash_keys_refuses_a_partial_hash():
    with pytest.raises(ValueError, match="17 bytes"):
        hash_keys(HEAD, b"x" * 17)


@pytest.mark.single_server("a packed command goes to one server")
def test_a_packed_unlink_deletes_exactly_its_keys(redis_client):
    """Two of the three named keys exist: the server answers 2 and the third, unnamed, key stays."""
    hashes = [bytes([i]) * 16 for i in range(4)]
    for h in (hashes[0], hashes[2], hashes[3]):
        redis_client.set(HEAD + h.hex(), b"v")
    conn = redis_client.connection_pool.get_connection()
    try:
        conn.send_packed_command([unlink_hashes(HEAD, b"".join(hashes[:3]))])
        assert conn.read_response() == 2
    finally:
        redis_client.connection_pool.release(conn)
    assert redis_client.keys("*") == [(HEAD + hashes[3].hex()).encode()]
