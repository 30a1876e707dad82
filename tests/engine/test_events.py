"""kvcli.engine.events and kvcli.engine.recording: KV event batches decoded from real vLLM bytes and recordings
(tests/engine/fixtures/, README there), from each engine's encoding, and refused when malformed.

The counts asserted on the fixtures were checked by hand against the synthetic trace's design
(bench/engine_record.py, ``synthetic_trace``): with an unbounded cache, s01 stores 3 blocks (120 tokens), s03 2
(64), s04 1 (its second block again: vLLM recomputes the last block of a prompt it holds whole), s06 3 (another
cache salt), s07 3, s08 5 (160 tokens), s11 1 (a fifth block after the 4 it shares with s08) and s13 1 (s08
again, its last block recomputed): 8 batches, 19 blocks. Every other request only hits.
"""
from __future__ import annotations

import base64
import gzip
import json
import re
from collections import Counter
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.engine.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_batch,
    decode_payload,
    normalize_hash,
)
from kvcli.engine.recording import RecordedBatch, RecordingWriter, read_batches
from kvcli.errors import BadInputError
from kvcli.store.enginehash import block_hashes

FIXTURES = Path(__file__).parent / "fixtures"
SYNTHETIC, CHAT = FIXTURES / "synthetic", FIXTURES / "chat"


def frames(path: Path) -> list[tuple[bytes, int, bytes]]:
    """``(topic, seq, payload)`` of each message of a ``.frames.bin`` file (4-byte big-endian length, bytes; three
    frames a message)."""
    data, out, at = path.read_bytes(), [], 0
    parts = []
    while at < len(data):
        n = int.from_bytes(data[at:at + 4], "big")
        parts.append(data[at + 4:at + 4 + n])
        at += 4 + n
    assert len(parts) % 3 == 0
    for topic, seq, payload in zip(parts[::3], parts[1::3], parts[2::3]):
        out.append((topic, int.from_bytes(seq, "big"), payload))
    return out


def trace(folder: Path) -> list[dict]:
    path = folder / "trace.jsonl"
    opened = gzip.open(f"{path}.gz", "rt") if not path.exists() else open(path)
    with opened as f:
        return [json.loads(line) for line in f]


def events_path(folder: Path, run: str) -> Path:
    path = folder / f"{run}.events.jsonl"
    return path if path.exists() else Path(f"{path}.gz")


def engine_requests(folder: Path, run: str) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{run}.requests.jsonl").read_text().splitlines()]


def tally(batches: list[RecordedBatch]) -> tuple[Counter, int, int]:
    """Events by type, blocks stored, blocks removed."""
    kinds: Counter = Counter()
    stored = removed = 0
    for b in batches:
        for e in b.batch.events:
            kinds[type(e).__name__] += 1
            stored += len(e.block_hashes) if isinstance(e, BlockStored) else 0
            removed += len(e.block_hashes) if isinstance(e, BlockRemoved) else 0
    return kinds, stored, removed


# ------------------------------------------------------------------------------------------- real vLLM bytes

@pytest.mark.parametrize("run, hash_bytes", [("unbounded", 8), ("bounded-10", 32)])
def test_real_frames_decode_as_the_recording_holds_them(run, hash_bytes):
    """The raw ZMQ messages vLLM 0.32.0 sent (integer hashes in the unbounded run, sha256 bytes in the bounded one)
    decode to the same batches as the JSON lines the recorder wrote for the same sequence numbers."""
    messages = frames(SYNTHETIC / f"{run}.frames.bin")
    recorded = {b.seq: b.batch for b in read_batches(events_path(SYNTHETIC, run))}
    assert [seq for _, seq, _ in messages] == list(range(6))
    for topic, seq, payload in messages:
        assert topic == b"kv"
        batch = decode_payload(payload)
        assert batch == recorded[seq]
        assert batch.dp_rank == 0 and batch.unknown == ()
        for e in batch.events:
            if isinstance(e, BlockStored):
                assert all(len(h) == hash_bytes for h in e.block_hashes)
                assert len(e.token_ids) == 32 * len(e.block_hashes) and e.block_size == 32
                assert e.medium == "GPU" and e.lora_id is None


def test_first_real_batch_by_hand():
    """Sequence 0: the reset before the first request, then s01's 3 full blocks (its first 96 tokens)."""
    _, seq, payload = frames(SYNTHETIC / "unbounded.frames.bin")[0]
    batch = decode_payload(payload)
    s01 = trace(SYNTHETIC)[0]["token_ids"]
    assert seq == 0 and len(batch.events) == 2
    cleared, stored = batch.events
    assert cleared == AllBlocksCleared()
    assert isinstance(stored, BlockStored)
    assert stored.parent_block_hash is None and len(stored.block_hashes) == 3 and stored.token_ids == tuple(s01[:96])


def test_real_hashes_are_vllms_sha256_chain_and_its_low_64_bits():
    """The bytes run's hashes are kvcli's ``vllm-sha256`` chain (kvcli.store.enginehash) of the trace's prompts,
    cache salt included; the integer run's are their last 8 bytes (vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``)."""
    chain = set()
    for r in trace(SYNTHETIC):
        chain.update(bytes.fromhex(h) for h in block_hashes("vllm-sha256", r["token_ids"], 32,
                                                             cache_salt=r.get("cache_salt", "")))
    for run, key in (("bounded-10", lambda h: h), ("unbounded", lambda h: h[-8:])):
        expected = {key(h) for h in chain}
        seen = {h for b in read_batches(events_path(SYNTHETIC, run)) for e in b.batch.events
                if isinstance(e, (BlockStored, BlockRemoved)) for h in e.block_hashes}
        assert seen and seen <= expected, run


@pytest.mark.parametrize("folder, run, batches, kinds, stored, removed", [
    (SYNTHETIC, "unbounded", 8, {"AllBlocksCleared": 1, "BlockStored": 8}, 19, 0),
    (SYNTHETIC, "bounded-10", 12, {"AllBlocksCleared": 1, "BlockStored": 12, "BlockRemoved": 24}, 32, 24),
    (CHAT, "unbounded", 24, {"AllBlocksCleared": 1, "BlockStored": 24}, 205, 0),
    (CHAT, "bounded-100", 24, {"AllBlocksCleared": 1, "BlockStored": 24, "BlockRemoved": 454}, 552, 454),
])
def test_recorded_runs_counts(folder, run, batches, kinds, stored, removed):
    """Each recording's batches and events. Every full block a request did not hit is stored (the recomputed last
    block of a prompt held whole included), so the blocks stored are the requests' full blocks less their hits;
    the bounded runs' removals are checked against vLLM's pool in test_explain_vs_vllm.py."""
    recorded = list(read_batches(events_path(folder, run)))
    assert [b.seq for b in recorded] == list(range(batches))
    assert not any(b.replayed for b in recorded)
    assert tally(recorded) == (Counter(kinds), stored, removed)
    assert stored == sum(r["prompt_tokens"] // 32 - r["cached_tokens"] // 32 for r in engine_requests(folder, run))


def test_recorded_tokens_are_the_prompts():
    """A BlockStored's token ids are its blocks' tokens: with no parent, a prompt's first tokens."""
    prompts = [r["token_ids"] for r in trace(CHAT)]
    for b in read_batches(events_path(CHAT, "unbounded")):
        for e in b.batch.events:
            if isinstance(e, BlockStored) and e.parent_block_hash is None:
                assert any(p[:len(e.token_ids)] == list(e.token_ids) for p in prompts)


# ------------------------------------------------------------------------------------------- the encodings

def as_array(event: dict) -> list:
    """A vLLM 0.32.0 map event in the older array encoding: the tag, then the fields in declaration order."""
    order = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                             "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"),
             "BlockRemoved": ("block_hashes", "medium", "group_idx"), "AllBlocksCleared": ()}[event["type"]]
    return [event["type"], *(event.get(f) for f in order)]


def test_real_map_events_decode_the_same_as_arrays():
    for _, _, payload in frames(SYNTHETIC / "bounded-10.frames.bin"):
        raw = msgpack.unpackb(payload, raw=False)
        arrays = [raw[0], [as_array(e) for e in raw[1]], raw[2]]
        assert decode_payload(msgpack.packb(arrays)) == decode_payload(payload)


def test_sglang_arrays():
    """SGLang's events stop after lora_id (BlockRemoved: after block_hashes); its batches have no dp_rank."""
    payload = msgpack.packb([1.5, [["BlockStored", [1, -2], None, list(range(32)), 16, None],
                                   ["BlockRemoved", [2**64 - 2]], ["AllBlocksCleared"]]])
    batch = decode_payload(payload)
    minus_two = b"\xff" * 7 + b"\xfe"
    assert batch == EventBatch(1.5, (BlockStored((b"\0" * 7 + b"\1", minus_two), None, tuple(range(32)), 16),
                                     BlockRemoved((minus_two,)), AllBlocksCleared()), None)


def test_mooncake_store_events():
    """Mooncake Store's 8-field BlockStoreEvent (string hashes, "" unset), RemoveAllEvent, and BlockUpdateEvent
    (a replica moved: skipped, named in ``unknown``)."""
    payload = msgpack.packb([1.0, [
        ["BlockStoreEvent", "key-1", [["memory", "tcp://10.0.0.1:6000"]], "llama", 16, "0x0a0b", "", [1, 2, 3]],
        ["BlockStoreEvent", "key-2", [], "", 16, "block-2", "0A0B", [4]],
        ["BlockUpdateEvent", "key-1", [["disk", "/data/k1"]]], ["RemoveAllEvent"]]])
    batch = decode_payload(payload)
    assert batch.events == (BlockStored((b"\x0a\x0b",), None, (1, 2, 3), 16),
                            BlockStored((b"block-2",), b"\x0a\x0b", (4,), 16), AllBlocksCleared())
    assert batch.unknown == ("BlockUpdateEvent",) and batch.dp_rank is None


def test_unknown_fields_and_event_types_are_skipped():
    payload = msgpack.packb([2, [{"type": "BlockStored", "block_hashes": [b"h"], "parent_block_hash": None,
                                  "token_ids": [], "block_size": 32, "session_id": "x", "locality": "LOCAL"},
                                 {"type": "BlockMoved", "to": "CPU"}, ["Reserved", 1]], 3], use_bin_type=True)
    batch = decode_payload(payload)
    assert batch == EventBatch(2.0, (BlockStored((b"h",), None, (), 32),), 3, ("BlockMoved", "Reserved"))


@pytest.mark.parametrize("value, expected", [
    (0, bytes(8)), (2**64 - 1, b"\xff" * 8), (-1, b"\xff" * 8), (-(2**63), b"\x80" + bytes(7)),
    (b"\x01\x02", b"\x01\x02"), ("0x0102", b"\x01\x02"), ("ABCD", b"\xab\xcd"),
])
def test_normalize_hash(value, expected):
    assert normalize_hash(value) == expected


def test_normalize_hash_text():
    assert normalize_hash(base64.b64encode(b"\x01" * 32).decode(), text_hashes=True) == b"\x01" * 32
    assert normalize_hash("not hex", mooncake=True) == b"not hex"


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, True, 1.5, b"", "", "not hex", None, [1]])
def test_normalize_hash_refuses(value):
    with pytest.raises(ValueError):
        normalize_hash(value, text_hashes=True)


# ------------------------------------------------------------------------------------------- round trips

HASH = st.one_of(st.binary(min_size=8, max_size=8), st.binary(min_size=32, max_size=32))
TOKENS = st.lists(st.integers(0, 2**32 - 1), max_size=40).map(tuple)
MEDIUM = st.one_of(st.none(), st.sampled_from(["GPU", "CPU", "STORAGE"]))
STORED = st.builds(BlockStored, st.lists(HASH, max_size=4).map(tuple), st.one_of(st.none(), HASH), TOKENS,
                   st.integers(0, 4096), st.one_of(st.none(), st.integers(-(2**31), 2**31)), MEDIUM,
                   st.one_of(st.none(), st.lists(st.one_of(st.none(), st.lists(st.text(max_size=4), min_size=1,
                                                                               max_size=2).map(tuple)),
                                                 max_size=3).map(tuple)))
REMOVED = st.builds(BlockRemoved, st.lists(HASH, max_size=4).map(tuple), MEDIUM)
EVENT = st.one_of(STORED, REMOVED, st.just(AllBlocksCleared()))
BATCH = st.builds(EventBatch, st.floats(0, 2e9), st.lists(EVENT, max_size=5).map(tuple),
                  st.one_of(st.none(), st.integers(0, 64)))


def wire_hash(h: bytes, draw, text: bool):
    """One hash as an engine might send it: an 8-byte one as an unsigned or signed integer, or bytes (in JSON:
    hex, 0x-hex or base64)."""
    if len(h) == 8 and draw(st.booleans()):
        return int.from_bytes(h, "big", signed=draw(st.booleans()))
    if not text:
        return h
    return draw(st.sampled_from([h.hex(), "0x" + h.hex().upper(), base64.b64encode(h).decode()]))


def encode(batch: EventBatch, draw, style: str, text: bool = False) -> list:
    """``batch`` as vLLM's maps (with fields kvcli ignores) or vLLM's arrays."""
    def hashes(hs):
        return [wire_hash(h, draw, text) for h in hs]

    def event(e):
        if isinstance(e, AllBlocksCleared):
            return {"type": "AllBlocksCleared"} if style == "map" else ["AllBlocksCleared"]
        if isinstance(e, BlockRemoved):
            fields = {"block_hashes": hashes(e.block_hashes), "medium": e.medium, "group_idx": 0}
            return {"type": "BlockRemoved", **fields} if style == "map" else ["BlockRemoved", *fields.values()]
        parent = None if e.parent_block_hash is None else wire_hash(e.parent_block_hash, draw, text)
        fields = {"block_hashes": hashes(e.block_hashes), "parent_block_hash": parent, "token_ids": list(e.token_ids),
                  "block_size": e.block_size, "lora_id": e.lora_id, "medium": e.medium, "lora_name": None,
                  "extra_keys": None if e.extra_keys is None else [k and list(k) for k in e.extra_keys]}
        return {"type": "BlockStored", **fields} if style == "map" else ["BlockStored", *fields.values()]

    return [batch.ts, [event(e) for e in batch.events], batch.dp_rank]


@settings(max_examples=200, deadline=None)
@given(BATCH, st.sampled_from(["map", "array"]), st.data())
def test_msgpack_round_trip(batch, style, data):
    assert decode_payload(msgpack.packb(encode(batch, data.draw, style), use_bin_type=True)) == batch


@settings(max_examples=200, deadline=None)
@given(BATCH, st.sampled_from(["map", "array"]), st.data())
def test_json_round_trip(batch, style, data):
    line = json.dumps(encode(batch, data.draw, style, text=True))
    assert decode_batch(json.loads(line), text_hashes=True) == batch


@settings(max_examples=100, deadline=None)
@given(st.lists(BATCH, max_size=4), st.data())
def test_recording_round_trip(tmp_path_factory, batches, data):
    """What the writer writes (msgpack-decoded payloads, bytes as hex) reads back as the same batches."""
    path = tmp_path_factory.mktemp("rec") / "events.jsonl"
    writer = RecordingWriter(path, "tcp://127.0.0.1:1", "kv", None)
    for seq, batch in enumerate(batches):
        payload = msgpack.unpackb(msgpack.packb(encode(batch, data.draw, "map"), use_bin_type=True), raw=False)
        writer.batch(seq, 1.0 + seq, "kv", payload, replayed=seq == 1)
    writer.missed(7, 9)
    writer.close()
    read = list(read_batches(path))
    assert [b.batch for b in read] == batches
    assert [b.seq for b in read] == list(range(len(batches)))
    assert [b.replayed for b in read] == [seq == 1 for seq in range(len(batches))]
    assert all(line.endswith("\n") for line in path.read_text().splitlines(keepends=True))


# ------------------------------------------------------------------------------------------- bad input

@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_payload_is_bad_input_or_a_batch(payload):
    try:
        assert isinstance(decode_payload(payload, "frames.bin", 3), EventBatch)
    except BadInputError as exc:
        assert str(exc).startswith("frames.bin:3: ")


JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text()),
                       lambda inner: st.one_of(st.lists(inner, max_size=4),
                                               st.dictionaries(st.sampled_from(["type", "batch", "seq", "block_hashes",
                                                                                "received_at", "token_ids"]),
                                                               inner, max_size=4)), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_garbage_json_line_names_file_and_line(tmp_path_factory, value):
    path = tmp_path_factory.mktemp("bad") / "batches.jsonl"
    path.write_text("[1.0, [], 0]\n" + json.dumps(value) + "\n")
    try:
        list(read_batches(path))
    except BadInputError as exc:
        assert str(exc).startswith(f"{path}:2: "), str(exc)


@pytest.mark.parametrize("line, message", [
    ('{"seq": 1', "invalid JSON"),
    ('"text"', "a line is a KV event batch"),
    ('[1.0, [{"type": "BlockStored", "block_hashes": []}], 0]', "event 0: BlockStored lacks parent_block_hash"),
    ('[1.0, [["BlockStored", ["zz"], null, [], 16]]]', "neither hex nor base64"),
    ('[1.0, [["BlockRemoved", [1.5]]]]', "a block hash is bytes"),
    ('[true, []]', "batch ts must be a number"),
    ('{"kvcli_kv_events": 2}', "version 2"),
    ('{"seq": 4, "received_at": 1.0, "topic": "", "payload_hex": "c1", "error": "bad"}', "could not decode"),
    ('{"seq": -1, "received_at": 1.0, "batch": [1.0, []]}', "seq (an integer >= 0)"),
])
def test_bad_lines(tmp_path, line, message):
    path = tmp_path / "events.jsonl"
    path.write_text('{"kvcli_kv_events": 1}\n\n' + line + "\n")
    with pytest.raises(BadInputError, match=re.escape(message)) as info:
        list(read_batches(path))
    assert str(info.value).startswith(f"{path}:3: ")


def test_plain_batches_file_with_msgspec_json_hashes(tmp_path):
    """A subscriber's log of msgspec-JSON batches: bytes hashes are base64 there."""
    digest = bytes(range(32))
    path = tmp_path / "batches.jsonl"
    path.write_text(json.dumps([5.0, [{"type": "BlockRemoved", "block_hashes": [base64.b64encode(digest).decode()],
                                       "medium": "GPU"}], 1]) + "\n")
    [read] = read_batches(path)
    assert read == RecordedBatch(EventBatch(5.0, (BlockRemoved((digest,), "GPU"),), 1), None, None, False,
                                 f"{path}:1")


def test_missing_file(tmp_path):
    with pytest.raises(BadInputError, match="file not found"):
        list(read_batches(tmp_path / "nope.jsonl"))
