"""``kvcli events record``: subscribe to an engine's KV events over ZMQ and write them to a kvcli recording
(:mod:`kvcli.engine.recording`), asking the engine's replay socket for the batches a gap in the sequence numbers
says were missed.

The wire protocol is vLLM's (vllm/distributed/kv_events.py in vLLM 0.32.0), which SGLang and Mooncake Store share:

* the PUB socket sends ``[topic, sequence (8 bytes, big-endian unsigned), msgpack payload]``, sequence numbers
  counting up from 0 when the publisher starts;
* the ROUTER replay socket takes ``[empty, first sequence (8 bytes, big-endian)]`` from a DEALER and answers with
  every batch it still buffers from that number on, ``[empty, topic, sequence, payload]`` (SGLang: without the
  topic), then an end marker whose sequence is ``-1`` (8 bytes of 0xff) and whose payload is empty.

Batches published before the recorder subscribed are not asked for: the first sequence number received starts
the recording. Memory is bounded: each batch is written (one whole line, handed to the OS) before the next is
read, and a replay is streamed the same way. SIGINT and SIGTERM stop the recording between two lines (when it runs
in the main thread), so the file ends with a whole line; the file is fsynced before :func:`record` returns.
"""
from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import zmq

from kvcli.engine.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, decode_batch
from kvcli.engine.recording import RecordingWriter
from kvcli.errors import BadInputError

END_SEQ = (1 << 64) - 1  # the replay socket's end marker, -1 as 8 unsigned bytes


@dataclass(frozen=True, slots=True)
class RecordConfig:
    """What to record: the PUB ``endpoint`` (``tcp://host:port``), the file ``out``, the ``topic`` prefix to subscribe
    to ("" = all), the ROUTER ``replay_endpoint`` (None: gaps are recorded as missed), and when to stop: after
    ``max_batches`` batches or ``duration_seconds`` (None: on a signal or ``stop`` only). ``replay_timeout_seconds``
    bounds the wait for each replayed frame; ``poll_seconds`` is how often a stop request is checked."""

    endpoint: str
    out: Path
    topic: str = ""
    replay_endpoint: str | None = None
    max_batches: int | None = None
    duration_seconds: float | None = None
    replay_timeout_seconds: float = 2.0
    poll_seconds: float = 0.1


@dataclass
class RecordSummary:
    """What a recording holds: ``batches`` written (``replayed`` of them from the replay socket), the events by type
    (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``, and the tags of unknown ones), the blocks stored and
    removed, the gaps seen and the sequence numbers ``missed`` for good, the publisher's ``restarts`` (a sequence
    number not above the last), messages and payloads that were not batches, the first and last sequence numbers,
    the file's bytes, the seconds it ran, and why it stopped (``"max-batches"``, ``"duration"``, ``"SIGINT"``,
    ``"SIGTERM"``, ``"stopped"``; ``signal_number`` for the signals)."""

    out: str
    batches: int = 0
    replayed: int = 0
    events: Counter[str] = field(default_factory=Counter)
    blocks_stored: int = 0
    blocks_removed: int = 0
    gaps: int = 0
    missed: int = 0
    restarts: int = 0
    bad_payloads: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    bytes_written: int = 0
    elapsed_seconds: float = 0.0
    stopped_by: str = ""
    signal_number: int | None = None

    def add(self, seq: int, batch: EventBatch, replayed: bool) -> None:
        """Count one written batch."""
        self.batches += 1
        self.replayed += replayed
        self.first_seq = seq if self.first_seq is None else self.first_seq
        self.last_seq = seq
        for event in batch.events:
            self.events[type(event).__name__] += 1
            if isinstance(event, BlockStored):
                self.blocks_stored += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.blocks_removed += len(event.block_hashes)
            else:
                assert isinstance(event, AllBlocksCleared)
        self.events.update(batch.unknown)


class _Recorder:
    """One recording's sockets, writer and counts (:func:`record` drives it)."""

    def __init__(self, config: RecordConfig, ctx: zmq.Context, sub: zmq.Socket, writer: RecordingWriter,
                 note: Callable[[str], None]) -> None:
        self.config, self.ctx, self.sub, self.writer, self.note = config, ctx, sub, writer, note
        self.summary = RecordSummary(str(config.out))
        self.last_seq: int | None = None
        sub.setsockopt(zmq.SUBSCRIBE, config.topic.encode())

    def full(self) -> bool:
        return self.config.max_batches is not None and self.summary.batches >= self.config.max_batches

    def receive(self, timeout_seconds: float) -> None:
        """Wait up to ``timeout_seconds`` for one message and record it (a gap before it replayed first)."""
        if not self.sub.poll(max(1, int(timeout_seconds * 1000))):
            return
        frames = self.sub.recv_multipart()
        if len(frames) != 3 or len(frames[1]) != 8:
            self.summary.bad_payloads += 1
            self.note(f"skipped a message of {len(frames)} frames (a KV event batch is topic, 8-byte sequence, "
                      "payload)")
            return
        seq = int.from_bytes(frames[1], "big")
        if self.last_seq is not None and seq > self.last_seq + 1:
            self.fill(self.last_seq + 1, seq)
        elif self.last_seq is not None and seq <= self.last_seq:
            self.summary.restarts += 1
            self.note(f"sequence {seq} after {self.last_seq}: the publisher restarted")
        if not self.full():
            self.write(seq, frames[0], frames[2], replayed=False)

    def write(self, seq: int, topic: bytes, payload: bytes, replayed: bool) -> None:
        now, topic_text = time.time(), topic.decode(errors="replace")
        try:
            value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
            batch = decode_batch(value)
        except (ValueError, TypeError, BadInputError) as exc:
            self.writer.undecodable(seq, now, topic_text, payload, str(exc))
            self.summary.bad_payloads += 1
            self.note(f"sequence {seq}: not a KV event batch ({exc}); kept as hex")
        else:
            self.writer.batch(seq, now, topic_text, value, replayed)
            self.summary.add(seq, batch, replayed)
        self.last_seq = seq

    def fill(self, first: int, until: int) -> None:
        """Record sequence numbers ``first..until-1`` from the replay socket, and what it lacks as missed."""
        self.summary.gaps += 1
        got = self.replay(first, until) if self.config.replay_endpoint else first
        if got < until:
            self.missed(got, until - 1)
        how = f"replayed {got - first}" if self.config.replay_endpoint else "no --replay endpoint"
        self.note(f"gap: sequence {first}..{until - 1} missing; {how}" + (f", missed {until - got}"
                                                                            if got < until else ""))

    def replay(self, first: int, until: int) -> int:
        """Ask the replay socket for ``first`` on and write the batches up to ``until - 1`` in order (any it skips
        recorded as missed); returns the next sequence number still missing (``until`` when none is)."""
        assert self.config.replay_endpoint is not None
        dealer = _socket(self.ctx, zmq.DEALER, self.config.replay_endpoint)  # a fresh one: no late answer lingers
        expected, timeout_ms = first, int(self.config.replay_timeout_seconds * 1000)
        try:
            dealer.send_multipart([b"", first.to_bytes(8, "big")])
            while dealer.poll(timeout_ms) and (answer := _replayed(dealer.recv_multipart())) is not None:
                topic, seq, payload = answer
                if not expected <= seq < until or self.full():
                    continue  # before the gap, or past it: the live stream has it
                if seq > expected:  # the replay buffer no longer holds these
                    self.missed(expected, seq - 1)
                self.write(seq, topic, payload, replayed=True)
                expected = seq + 1
        finally:
            dealer.close(linger=0)
        return expected

    def missed(self, first: int, last: int) -> None:
        self.writer.missed(first, last)
        self.summary.missed += last - first + 1


def record(config: RecordConfig, stop: threading.Event | None = None,
           note: Callable[[str], None] = lambda line: None) -> RecordSummary:
    """Record ``config.endpoint``'s KV events into ``config.out`` (a kvcli recording, overwritten) until
    ``max_batches``, ``duration_seconds``, ``stop`` being set, or (in the main thread) SIGINT or SIGTERM.

    Args:
        config: what to record and when to stop.
        stop: set it from another thread to end the recording after the line being written.
        note: called with one line for each gap, replay and skipped message (progress, for stderr).

    Returns:
        The :class:`RecordSummary`; ``signal_number`` is set when a signal stopped it.

    Raises:
        BadInputError: an endpoint ZMQ cannot use, or ``out`` cannot be written.
        KvcliError: a write failed.
    """
    stop = stop or threading.Event()
    caught: list[int] = []
    ctx = zmq.Context()
    try:  # the endpoints are checked before the file is opened: a mistyped one leaves no file behind
        sub = _socket(ctx, zmq.SUB, config.endpoint)
        if config.replay_endpoint is not None:
            _socket(ctx, zmq.DEALER, config.replay_endpoint).close(linger=0)
        writer = RecordingWriter(config.out, config.endpoint, config.topic, config.replay_endpoint)
    except BaseException:
        ctx.destroy(linger=0)
        raise
    restore = _catch_signals(stop, caught)
    start = time.monotonic()
    try:
        recorder = _Recorder(config, ctx, sub, writer, note)
        deadline = start + config.duration_seconds if config.duration_seconds is not None else None
        while not stop.is_set() and not recorder.full():
            left = config.poll_seconds if deadline is None else min(config.poll_seconds, deadline - time.monotonic())
            if left <= 0:
                break
            recorder.receive(left)
    finally:
        try:
            writer.close()
        finally:
            ctx.destroy(linger=0)
            restore()
    summary = recorder.summary
    summary.stopped_by = ("max-batches" if recorder.full() else signal.Signals(caught[0]).name if caught else
                          "stopped" if stop.is_set() else "duration")
    summary.signal_number = caught[0] if caught else None
    summary.bytes_written = writer.bytes_written
    summary.elapsed_seconds = time.monotonic() - start
    return summary


def _replayed(frames: list[bytes]) -> tuple[bytes, int, bytes] | None:
    """``(topic, seq, payload)`` of one answer of the replay socket; None for its end marker (or an answer of
    another shape, which ends the replay too)."""
    if frames and frames[0] == b"":
        frames = frames[1:]  # the empty delimiter a DEALER sees first
    if len(frames) == 2:
        frames = [b"", *frames]  # SGLang answers without the topic
    if len(frames) != 3 or len(frames[1]) != 8:
        return None
    seq = int.from_bytes(frames[1], "big")
    return None if seq == END_SEQ or not frames[2] else (frames[0], seq, frames[2])


def _socket(ctx: zmq.Context, kind: int, endpoint: str) -> zmq.Socket:
    """A socket of ``kind`` connected to ``endpoint``."""
    sock = ctx.socket(kind)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise BadInputError(f"cannot connect to {endpoint!r}: {exc} (an endpoint is tcp://HOST:PORT, ipc://PATH, "
                            "...)") from None
    return sock


def _catch_signals(stop: threading.Event, caught: list[int]) -> Callable[[], None]:
    """In the main thread, make SIGINT and SIGTERM set ``stop`` (noting the signal) instead of raising, so no line
    is cut; returns what puts the previous handlers back. Elsewhere, nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame) -> None:
        caught.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)
    return restore
