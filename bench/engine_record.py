"""Record a real vLLM engine's KV events and per-request cached tokens on small traces: the fixtures under
tests/engine/fixtures/ (their README says what each file is).

Run with vLLM's own environment, kvcli's source on the path (the script uses kvcli.model.hf_tiny for the tiny
checkpoint and tokenizer, and kvcli.engine.record for the recording; their imports, torch, transformers, tokenizers,
msgpack and pyzmq, are all in a vLLM CPU install, with ``pip install msgpack``):

    PYTHONPATH=. /work/vllm-venv/bin/python bench/engine_record.py --out tests/engine/fixtures

The driver builds a tiny random Llama (hidden 256, 4 query heads, 2 KV heads of head_dim 64, 2 layers, bfloat16,
vocabulary 512) with kvcli's tiny tokenizer, writes each trace as token ids (``trace.jsonl``, kvcli's native
format), then runs each configuration in a child process of its own (a fresh engine, and the environment variable
that picks vLLM's hash representation read at its start): the offline ``LLM`` at block size 32 with prefix caching,
``num_gpu_blocks_override`` blocks, and KV events published over ZMQ; the requests go one at a time, each with
``max_tokens=1``. Each run writes ``<run>.events.jsonl`` (kvcli's recording, made by kvcli.engine.record while the
engine runs), ``<run>.requests.jsonl`` (``id``, ``prompt_tokens``, ``cached_tokens`` = vLLM's
``RequestOutput.num_cached_tokens``), and, for the synthetic trace, ``<run>.frames.bin``: the first raw ZMQ
messages, each frame as a 4-byte big-endian length and its bytes, three frames a message. The chat trace's files
over 32 KiB are gzipped at the end (kvcli reads them so).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BLOCK_SIZE = 32
#: (trace, run name, num_gpu_blocks_override, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES). vLLM keeps one of the blocks as
#: its null block, so N blocks cache at most N - 1. 2048 blocks (65,504 tokens) hold either trace whole.
RUNS = [
    ("synthetic", "unbounded", 2048, "1"),
    ("synthetic", "bounded-10", 10, "0"),
    ("chat", "unbounded", 2048, "1"),
    ("chat", "bounded-100", 100, "1"),
]
RAW_MESSAGES = 6  # raw ZMQ messages kept per synthetic run
CHAT_TRACE = Path(__file__).resolve().parent.parent / "sample_traces" / "chat_shared_system.jsonl"


def synthetic_trace() -> list[dict]:
    """Token-id requests built to exercise the cache at block size 32: shared document prefixes of 64 to 150 tokens
    with different questions, exact repeats of a prompt of whole blocks (64 and 160 tokens), a shorter prefix of a
    cached document, and a cache salt that keeps an otherwise identical prompt apart. Token ids 5..499 (the tiny
    vocabulary is 512; ids 0-4 are its special tokens)."""
    rng = random.Random(20261205)

    def toks(n: int) -> list[int]:
        return [rng.randrange(5, 500) for _ in range(n)]

    a, b, c, d = toks(100), toks(64), toks(80), toks(150)
    q = [toks(n) for n in (20, 25, 10, 40, 10, 12, 30)]
    prompts = [("s01", a + q[0], ""), ("s02", a + q[1], ""), ("s03", b, ""), ("s04", b, ""),
               ("s05", a[:64] + q[2], ""), ("s06", a + q[0], "t2"), ("s07", c + q[3], ""), ("s08", d + q[4][:10], ""),
               ("s09", a + q[0], ""), ("s10", c + q[3], ""), ("s11", d + q[5], ""), ("s12", b + q[6], ""),
               ("s13", d + q[4][:10], ""), ("s14", a + q[1], "")]
    return [{"id": rid, "timestamp": float(i), **({"cache_salt": salt} if salt else {}), "token_ids": ids}
            for i, (rid, ids, salt) in enumerate(prompts)]


def chat_trace(tokenizer) -> list[dict]:
    """sample_traces/chat_shared_system.jsonl tokenized with the tiny tokenizer's chat template (generation prompt
    added), ids, timestamps and cache salts kept."""
    out = []
    for line in CHAT_TRACE.read_text().splitlines():
        record = json.loads(line)
        ids = tokenizer.apply_chat_template(record["messages"], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if not isinstance(ids, list) else ids)
        salt = record.get("cache_salt") or ""
        out.append({"id": record["id"], "timestamp": record["timestamp"], **({"cache_salt": salt} if salt else {}),
                    "token_ids": ids})
    return out


def build(out: Path, model_dir: Path) -> None:
    """The tiny checkpoint in ``model_dir`` and each trace's ``trace.jsonl`` under ``out``."""
    from kvcli.model.hf_tiny import build_tokenizer, write_tiny_checkpoint

    write_tiny_checkpoint(model_dir, vocab=512, dtype="bfloat16", hidden_size=256, head_dim=64,
                          intermediate_size=512, max_position_embeddings=4096)
    tokenizer = build_tokenizer(512)
    for name, requests in (("synthetic", synthetic_trace()), ("chat", chat_trace(tokenizer))):
        (out / name).mkdir(parents=True, exist_ok=True)
        with open(out / name / "trace.jsonl", "w") as f:
            f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in requests)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def capture_raw(endpoint: str, path: Path, count: int, stop: threading.Event) -> None:
    """Keep the first ``count`` messages on ``endpoint`` as they came, each frame length-prefixed."""
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    with open(path, "wb") as f:
        kept = 0
        while kept < count and not stop.is_set():
            if sub.poll(100):
                for frame in sub.recv_multipart():
                    f.write(len(frame).to_bytes(4, "big") + frame)
                kept += 1
    ctx.destroy(linger=0)


def run(out: Path, model_dir: Path, trace: str, name: str, blocks: int) -> None:
    """One configuration: a fresh engine, the recorder, the trace one request at a time (module docstring)."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVEventsConfig
    from vllm.inputs import TokensPrompt

    from kvcli.engine.record import RecordConfig, record

    folder = out / trace
    requests = [json.loads(line) for line in (folder / "trace.jsonl").read_text().splitlines()]
    longest = max(len(r["token_ids"]) for r in requests)
    pub, replay = free_port(), free_port()
    stop = threading.Event()
    config = RecordConfig(f"tcp://127.0.0.1:{pub}", folder / f"{name}.events.jsonl", topic="kv",
                          replay_endpoint=f"tcp://127.0.0.1:{replay}")
    recorder = threading.Thread(target=lambda: print(record(config, stop), file=sys.stderr))
    recorder.start()
    raw = None
    if trace == "synthetic":
        raw = threading.Thread(target=capture_raw, args=(config.endpoint, folder / f"{name}.frames.bin",
                                                         RAW_MESSAGES, stop))
        raw.start()
    llm = LLM(model=str(model_dir), tokenizer=str(model_dir), dtype="bfloat16", block_size=BLOCK_SIZE,
              enable_prefix_caching=True, enforce_eager=True, num_gpu_blocks_override=blocks,
              max_model_len=-(-(longest + 1) // BLOCK_SIZE) * BLOCK_SIZE, max_num_seqs=1, seed=0,
              kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                              endpoint=f"tcp://*:{pub}", replay_endpoint=f"tcp://*:{replay}",
                                              topic="kv"))
    llm.reset_prefix_cache()  # an AllBlocksCleared, published with the first request's batch
    params = SamplingParams(max_tokens=1, temperature=0.0)
    with open(folder / f"{name}.requests.jsonl", "w") as f:
        for r in requests:
            prompt = TokensPrompt(prompt_token_ids=r["token_ids"])
            if r.get("cache_salt"):
                prompt["cache_salt"] = r["cache_salt"]
            [output] = llm.generate([prompt], params, use_tqdm=False)
            f.write(json.dumps({"id": r["id"], "prompt_tokens": len(r["token_ids"]),
                                "cached_tokens": output.num_cached_tokens}) + "\n")
    time.sleep(3)  # the publisher thread sends each step's batch within milliseconds
    stop.set()
    recorder.join()
    if raw is not None:
        raw.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("tests/engine/fixtures"))
    parser.add_argument("--only", help="run only this trace/run, e.g. synthetic/bounded-10")
    parser.add_argument("--run", nargs=4, metavar=("MODEL", "TRACE", "NAME", "BLOCKS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        model_dir, trace, name, blocks = args.run
        run(args.out, Path(model_dir), trace, name, int(blocks))
        return 0
    with tempfile.TemporaryDirectory(prefix="kvcli-engine-record-") as tmp:
        model_dir = Path(tmp) / "tiny-llama"
        build(args.out, model_dir)
        for trace, name, blocks, int_hashes in RUNS:
            if args.only and args.only != f"{trace}/{name}":
                continue
            env = os.environ | {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": int_hashes, "VLLM_CPU_KVCACHE_SPACE": "1"}
            print(f"== {trace}/{name}: {blocks} blocks, int hashes {int_hashes}", file=sys.stderr, flush=True)
            command = [sys.executable, __file__, "--out", str(args.out), "--run", str(model_dir), trace, name,
                       str(blocks)]
            for attempt in range(3):  # a free port picked for ZMQ can be taken before the engine binds it
                if subprocess.run(command, env=env).returncode == 0:
                    break
                print(f"== {trace}/{name} failed (attempt {attempt + 1})", file=sys.stderr, flush=True)
            else:
                return 1
    for path in sorted((args.out / "chat").glob("*.jsonl")):
        if path.stat().st_size > 32 << 10:
            compress(path)
    return 0


def compress(path: Path) -> None:
    """``path`` gzipped to ``path.gz`` (no name or time in the header: the same bytes in give the same file),
    the original removed."""
    with open(path, "rb") as f, open(f"{path}.gz", "wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as gz:
        gz.write(f.read())
    path.unlink()


if __name__ == "__main__":
    sys.exit(main())
