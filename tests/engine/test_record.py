"""kvcli.engine.record and ``kvcli events record``: a recording of a real ZMQ publisher started here (XPUB, so it
publishes only once the recorder has subscribed) that sends vLLM 0.32.0's recorded payloads
(tests/engine/fixtures/synthetic/*.frames.bin), drops some, and answers replay requests on a ROUTER socket as
vllm/distributed/kv_events.py does (or as SGLang does, without the topic frame)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

zmq = pytest.importorskip("zmq", reason="pyzmq is a kvcli dependency (pyproject.toml): pip install pyzmq")

from kvcli.cli.app import app  # noqa: E402
from kvcli.engine.events import decode_payload  # noqa: E402
from kvcli.engine.record import RecordConfig, record  # noqa: E402
from kvcli.engine.recording import read_batches  # noqa: E402
from kvcli.errors import BadInputError  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "synthetic"
END = (-1).to_bytes(8, "big", signed=True)


def real_payloads() -> list[bytes]:
    out = []
    for name in ("unbounded.frames.bin", "bounded-10.frames.bin"):
        data, at, parts = (FIXTURES / name).read_bytes(), 0, []
        while at < len(data):
            n = int.from_bytes(data[at:at + 4], "big")
            parts.append(data[at + 4:at + 4 + n])
            at += 4 + n
        out += parts[2::3]
    return out


PAYLOADS = real_payloads()  # 12 real batches: sequence numbers 0..11 here


class Engine:
    """A publisher in a thread: ``payloads[i]`` as sequence ``i`` on topic ``kv``, except ``drop`` (sent only by the
    replay socket, which keeps ``payloads[i]`` for ``i >= replay_from``). ``forever``: then keeps publishing the
    payloads again, with growing sequence numbers, every ``interval`` seconds, until stopped."""

    def __init__(self, payloads=PAYLOADS, drop=(), replay_from=0, sglang=False, forever=False, interval=0.005,
                 extra=()):
        self.payloads, self.drop, self.replay_from, self.sglang = payloads, set(drop), replay_from, sglang
        self.forever, self.interval, self.extra = forever, interval, list(extra)
        self.ctx = zmq.Context()
        self.pub, self.router = self.ctx.socket(zmq.XPUB), self.ctx.socket(zmq.ROUTER)
        self.endpoint = f"tcp://127.0.0.1:{self.pub.bind_to_random_port('tcp://127.0.0.1')}"
        self.replay = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.stop, self.requests = threading.Event(), []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set() and not self.pub.poll(50):
            pass  # wait for the recorder's subscription
        if self.stop.is_set():
            return
        self.pub.recv()
        seq = 0
        while not self.stop.is_set():
            for message in self.extra:
                self.pub.send_multipart(message)
            self.extra = []
            payload = self.payloads[seq % len(self.payloads)]
            if seq not in self.drop and (self.forever or seq < len(self.payloads)):
                self.pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
            seq += 1
            self.serve(self.interval)

    def serve(self, seconds: float) -> None:
        """Answer replay requests for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not self.router.poll(max(1, int(left * 1000))):
                continue
            client, _, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.requests.append(first)
            for i, payload in enumerate(self.payloads):
                if i >= max(first, self.replay_from):
                    topic = [] if self.sglang else [b"kv"]
                    self.router.send_multipart([client, b"", *topic, i.to_bytes(8, "big"), payload])
            self.router.send_multipart([client, b"", *([] if self.sglang else [b""]), END, b""])

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.ctx.destroy(linger=0)


@pytest.fixture
def engine(request):
    made = []

    def start(**kwargs) -> Engine:
        made.append(Engine(**kwargs))
        return made[-1]
    yield start
    for e in made:
        e.close()


def cli(args: list[str]):
    return CliRunner().invoke(app, args)


def run(config: RecordConfig):
    stop = threading.Event()
    timer = threading.Timer(20, stop.set)  # a failing test ends instead of hanging
    timer.start()
    try:
        return record(config, stop)
    finally:
        timer.cancel()


def test_gaps_are_filled_from_the_replay_socket(engine, tmp_path):
    e = engine(drop={3, 4, 8})
    out = tmp_path / "events.jsonl"
    notes: list[str] = []
    summary = record(RecordConfig(e.endpoint, out, "kv", e.replay, max_batches=12), note=notes.append)
    read = list(read_batches(out))
    assert [b.seq for b in read] == list(range(12))
    assert [b.seq for b in read if b.replayed] == [3, 4, 8]
    assert [b.batch for b in read] == [decode_payload(p) for p in PAYLOADS]
    assert e.requests == [3, 8]
    assert (summary.batches, summary.replayed, summary.gaps, summary.missed) == (12, 3, 2, 0)
    # the first 6 batches of each synthetic run: s01, s03, s04, s06, s07, s08 store 3 + 2 + 1 + 3 + 3 + 5 blocks
    # in both; the bounded run's 9 blocks evict 8 of them on the way
    assert summary.events == {"AllBlocksCleared": 2, "BlockStored": 12, "BlockRemoved": 8}
    assert (summary.blocks_stored, summary.blocks_removed) == (34, 8)
    assert summary.stopped_by == "max-batches" and summary.bytes_written == out.stat().st_size
    assert notes == ["gap: sequence 3..4 missing; replayed 2", "gap: sequence 8..8 missing; replayed 1"]


def test_sglang_replay_answers_without_topic(engine, tmp_path):
    e = engine(drop={5}, sglang=True)
    out = tmp_path / "events.jsonl"
    summary = run(RecordConfig(e.endpoint, out, "", e.replay, max_batches=12))
    assert (summary.batches, summary.replayed, summary.missed) == (12, 1, 0)
    assert [b.seq for b in read_batches(out) if b.replayed] == [5]


def test_what_the_replay_buffer_lost_is_missed(engine, tmp_path):
    e = engine(drop={2, 3, 4}, replay_from=4)
    out = tmp_path / "events.jsonl"
    summary = run(RecordConfig(e.endpoint, out, "kv", e.replay, max_batches=10))
    assert (summary.batches, summary.replayed, summary.missed) == (10, 1, 2)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {"missed": [2, 3]} in lines
    assert [b.seq for b in read_batches(out)] == [0, 1, 4, 5, 6, 7, 8, 9, 10, 11]


def test_without_a_replay_endpoint_gaps_are_missed(engine, tmp_path):
    e = engine(drop={1, 6, 7})
    out = tmp_path / "events.jsonl"
    summary = run(RecordConfig(e.endpoint, out, max_batches=9))
    assert (summary.batches, summary.gaps, summary.missed) == (9, 2, 3)
    assert [b.seq for b in read_batches(out)] == [0, 2, 3, 4, 5, 8, 9, 10, 11]


def test_a_replay_socket_that_never_answers(engine, tmp_path):
    e = engine(drop={2})
    silent = zmq.Context().socket(zmq.ROUTER)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        summary = run(RecordConfig(e.endpoint, tmp_path / "e.jsonl", "kv", f"tcp://127.0.0.1:{port}",
                                   max_batches=11, replay_timeout_seconds=0.2))
    finally:
        silent.close(linger=0)
    assert (summary.batches, summary.missed) == (11, 1)


def test_duration_and_odd_messages(engine, tmp_path):
    """Stops on --duration; a message that is not 3 frames is skipped, a payload that is not a batch kept as hex
    (and reading the recording then names its line)."""
    e = engine(payloads=PAYLOADS[:3] + [b"\xc1not msgpack"], extra=[[b"kv", b"short"]])
    out = tmp_path / "events.jsonl"
    summary = run(RecordConfig(e.endpoint, out, duration_seconds=1.5))
    assert summary.stopped_by == "duration" and summary.batches == 3 and summary.bad_payloads == 2
    with pytest.raises(BadInputError, match=r"events.jsonl:5: the recorder could not decode"):
        list(read_batches(out))


@pytest.mark.parametrize("endpoint, replay", [("localhost:5557", None), ("tcp://127.0.0.1:5557", "localhost:5557")])
def test_bad_endpoint_writes_nothing(tmp_path, endpoint, replay):
    with pytest.raises(BadInputError, match="cannot connect to 'localhost:5557'"):
        record(RecordConfig(endpoint, tmp_path / "e.jsonl", replay_endpoint=replay))
    assert not (tmp_path / "e.jsonl").exists()


def test_unwritable_out(tmp_path):
    with pytest.raises(BadInputError, match="cannot write"):
        record(RecordConfig("tcp://127.0.0.1:5557", tmp_path / "no" / "e.jsonl"))


def test_cli_json_summary(engine, tmp_path):
    e = engine(drop={4})
    out = tmp_path / "events.jsonl"
    result = cli(["events", "record", e.endpoint, "--out", str(out), "--replay", e.replay, "--topic", "kv",
                       "--max-batches", "12", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["command"] == "events record" and doc["batches"] == 12 and doc["replayed_batches"] == 1
    assert doc["blocks_stored"] == 34 and doc["stopped_by"] == "max-batches"
    assert "gap: sequence 4..4 missing; replayed 1" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--max-batches", "0"], "--max-batches must be >= 1"),
    (["--duration", "0s"], "--duration must be > 0"),
    (["--duration", "soon"], "bad duration"),
])
def test_cli_bad_options(tmp_path, args, message):
    result = cli(["events", "record", "tcp://127.0.0.1:1", "--out", str(tmp_path / "e.jsonl"), *args])
    assert result.exit_code == 2 and message in result.stderr


def test_cli_out_is_a_directory(tmp_path):
    result = cli(["events", "record", "tcp://127.0.0.1:1", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--out is a directory" in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_leaves_whole_lines(engine, tmp_path, sig):
    """SIGTERM or Ctrl-C while batches stream in: exit 128 + the signal, the summary printed, every line whole."""
    e = engine(forever=True, interval=0.002)
    out = tmp_path / "events.jsonl"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                       os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "kvcli", "events", "record", e.endpoint, "--out", str(out),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not out.exists() or out.read_bytes().count(b"\n") < 200):
        time.sleep(0.05)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, stderr
    data = out.read_bytes()
    assert data.endswith(b"\n")
    seqs = [b.seq for b in read_batches(out)]
    assert len(seqs) >= 200 and seqs == list(range(len(seqs)))
    assert json.loads(stdout)["batches"] == len(seqs)
    assert json.loads(stdout)["stopped_by"] == signal.Signals(sig).name
