"""Redis commands packed as RESP bytes without Python work per key: keys made of one prefix and a 16-byte chunk
hash's hex each, laid out in one numpy pass.

A replay's batch script names every chunk of 256 requests (up to :data:`kvcli.store.batch.MAX_SCRIPT_KEYS` keys a
script) and its cleanup names every key it wrote; redis-py's packer encodes one argument at a time (~2 us each
here), which made packing the largest client cost of an index-only replay. Here all the keys of a command are one
``[keys, record]`` byte array: the bulk-string header and the prefix (the same in every row), the hex of the
hash, and the closing ``\\r\\n``.

Format: the Redis serialization protocol, RESP2 (redis.io, "Redis serialization protocol specification"): a command
is an array ``*<count>\\r\\n`` of bulk strings ``$<length>\\r\\n<bytes>\\r\\n``.
"""
from __future__ import annotations

import binascii

import numpy as np

HASH_BYTES = 16  # one chunk's prefix hash (kvcli.store.hashing)
_CRLF = np.frombuffer(b"\r\n", np.uint8)


def bulk(value: bytes | str | int) -> bytes:
    """One argument as a RESP bulk string (a str as UTF-8, an int in decimal)."""
    if isinstance(value, int):
        value = str(value)
    if isinstance(value, str):
        value = value.encode()
    return b"$%d\r\n%b\r\n" % (len(value), value)


def hash_keys(head: str | bytes, hashes: bytes) -> bytes:
    """The keys ``head + hash.hex()`` of every 16-byte hash in ``hashes`` (concatenated), as RESP bulk strings,
    concatenated in the same order.

    Raises:
        ValueError: ``hashes`` is not a whole number of 16-byte hashes.
    """
    if len(hashes) % HASH_BYTES:
        raise ValueError(f"{len(hashes)} bytes is not a whole number of {HASH_BYTES}-byte hashes")
    n = len(hashes) // HASH_BYTES
    prefix = head.encode() if isinstance(head, str) else head
    lead = b"$%d\r\n%b" % (len(prefix) + 2 * HASH_BYTES, prefix)
    width = len(lead) + 2 * HASH_BYTES + 2
    rows = np.empty((n, width), np.uint8)
    rows[:, :len(lead)] = np.frombuffer(lead, np.uint8)
    rows[:, len(lead):-2] = np.frombuffer(binascii.hexlify(hashes), np.uint8).reshape(n, 2 * HASH_BYTES)
    rows[:, -2:] = _CRLF
    return rows.tobytes()


def command(count: int, *parts: bytes) -> bytes:
    """A command of ``count`` arguments whose RESP bulk strings are ``parts`` (:func:`bulk`, :func:`hash_keys`),
    concatenated, behind the array header."""
    return b"".join((b"*%d\r\n" % count, *parts))


def unlink_hashes(head: str | bytes, hashes: bytes) -> bytes:
    """``UNLINK`` of the keys ``head + hash.hex()`` of every 16-byte hash in ``hashes`` (at least one), packed."""
    return command(1 + len(hashes) // HASH_BYTES, bulk(b"UNLINK"), hash_keys(head, hashes))
