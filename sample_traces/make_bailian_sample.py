"""Writes bailian_handmade.jsonl: a hand-made trace in the Qwen-Bailian schema (the real files are Git LFS objects
that could not be fetched). Deterministic: ``python sample_traces/make_bailian_sample.py``.

4 sessions x 3 turns sharing a 150-token system prompt; turn k's prompt is the system prompt, every earlier user
message and answer, then its own user message (20 + 7k tokens; answers 30 tokens). Block ids are kvcli export's
(16-token blocks, chained HMAC-SHA256 under the fixed, public key below, numbered in order of first appearance), so
a turn's last, partly filled block gets a new id at the next turn, as Bailian's documentation describes.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kvcli.traces.export import BlockNumbering

KEY = b"kvcli bailian sample key (public)"
SYSTEM = list(range(1, 151))


def main() -> None:
    numbering = BlockNumbering(KEY, 16)
    rows = []
    for s in range(4):
        history = list(SYSTEM)
        for k in range(1, 4):
            base = 1000 * (s + 1) + 100 * k
            prompt = history + list(range(base, base + 20 + 7 * k))
            answer = list(range(base + 50, base + 80))
            rows.append({"timestamp": round(2.0 * s + 0.5 + 8.0 * (k - 1), 3), "session": s, "turn": k,
                         "input_length": len(prompt), "output_length": len(answer),
                         "type": "file" if s == 3 else "text", "tokens": prompt})
            history = prompt + answer
    rows.sort(key=lambda r: r["timestamp"])
    last: dict[int, int] = {}
    out = []
    for chat_id, r in enumerate(rows):
        out.append({"chat_id": chat_id, "parent_chat_id": last.get(r["session"], -1), "timestamp": r["timestamp"],
                    "input_length": r["input_length"], "output_length": r["output_length"], "type": r["type"],
                    "turn": r["turn"], "hash_ids": numbering.ids_of(np.array(r["tokens"], dtype="<u4"))})
        last[r["session"]] = chat_id
    path = Path(__file__).with_name("bailian_handmade.jsonl")
    path.write_text("".join(json.dumps(r) + "\n" for r in out))


if __name__ == "__main__":
    main()
