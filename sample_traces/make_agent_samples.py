"""Writes the three agent/session samples (SOURCES.md says what each is): deterministic, ``python
sample_traces/make_agent_samples.py`` (pyarrow for the Parquet file).

* aiperf_agentic_code_3x5.jsonl -- the first five turns of each of the first three sessions (the file's first 32
  rows) of aiperf's agentic-code dataset ``docs/traces/inference-day-2026/dataset.jsonl`` (ai-dynamo/aiperf at
  988d33bc, Apache-2.0), transcribed below as id ranges: each row's ids are ``ceil(input_length / 512)``
  consecutive integers after the shared prefix.
* dynamo_exgentic_handmade.jsonl -- hand-made LLM spans of three agent sessions turned into Mooncake rows by the
  rules of Dynamo's ``benchmarks/exgentic_trace/convert_to_mooncake.py`` (ai-dynamo/dynamo at e13ed053): 512-token
  blocks, ids growing with the prompt and new after a prompt that shrank, the first span's start as ``timestamp``
  (epoch ms), each later span's ``delay`` = its start - the previous span's end.
* customer_service_handmade.parquet -- hand-made session/message/tool rows in the columns of aiperf's Mooncake
  chat rows as the customer-service agent traces publish them (``session_id``, ``messages``, ``output_length``,
  ``tools``, ``delay``): each row's messages are its whole conversation so far.
"""
from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).parent

# aiperf rows: (session, input_length, output_length, id ranges [(first, last)], timestamp or None, delay or None,
# group_id or None), in file order.
_L1 = (0, 62)
AIPERF_ROWS = [
    ("sess-c1ff91a76156", 42277, 335, [_L1, (9263, 9282)], 0.0, None, 46),
    ("sess-c1ff91a76156", 1855, 1345, [(9283, 9286)], None, 12219.3, None),
    ("sess-c1ff91a76156", 1845, 421, [(9287, 9290)], None, 7563.0, None),
    ("sess-c1ff91a76156", 2166, 721, [(9291, 9295)], None, 9765.9, None),
    ("sess-c1ff91a76156", 5558, 1066, [(9296, 9306)], None, 22430.7, None),
    ("sess-c1ff91a76156", 1922, 1700, [(9307, 9310)], None, 6351.1, None),
    ("sess-c1ff91a76156", 7186, 1149, [(9311, 9325)], None, 488.7, None),
    ("sess-c1ff91a76156", 4870, 928, [(9326, 9335)], None, 12500.9, None),
    ("sess-c1ff91a76156", 7062, 646, [(9336, 9349)], None, 1539.2, None),
    ("sess-c1ff91a76156", 15371, 1527, [(9350, 9380)], None, 564.6, None),
    ("sess-c1ff91a76156", 6781, 1359, [(9381, 9394)], None, 770.6, None),
    ("sess-c1ff91a76156", 3366, 375, [(9395, 9401)], None, 612.9, None),
    ("sess-c1ff91a76156", 7449, 889, [(9402, 9416)], None, 2172.5, None),
    ("sess-807584c5da8a", 52196, 1078, [_L1, (4663, 4682), (204063, 204081)], 0.0, None, 23),
    ("sess-807584c5da8a", 3722, 304, [(204082, 204089)], None, 1384.9, None),
    ("sess-807584c5da8a", 1769, 1905, [(204090, 204093)], None, 400.3, None),
    ("sess-807584c5da8a", 3324, 637, [(204094, 204100)], None, 3816.2, None),
    ("sess-807584c5da8a", 4954, 304, [(204101, 204110)], None, 143.3, None),
    ("sess-807584c5da8a", 4079, 681, [(204111, 204118)], None, 14212.4, None),
    ("sess-807584c5da8a", 13602, 1015, [(204119, 204145)], None, 1792.0, None),
    ("sess-807584c5da8a", 1736, 318, [(204146, 204149)], None, 258.4, None),
    ("sess-807584c5da8a", 1602, 1400, [(204150, 204153)], None, 939.7, None),
    ("sess-807584c5da8a", 1640, 956, [(204154, 204157)], None, 64784.8, None),
    ("sess-807584c5da8a", 3523, 888, [(204158, 204164)], None, 700.9, None),
    ("sess-807584c5da8a", 2581, 964, [(204165, 204170)], None, 293.9, None),
    ("sess-ff14c6c4aab3", 44083, 987, [_L1, (4063, 4082), (208063, 208066)], 0.0, None, 20),
    ("sess-ff14c6c4aab3", 578, 393, [(208067, 208068)], None, 614.0, None),
    ("sess-ff14c6c4aab3", 1816, 247, [(208069, 208072)], None, 6573.6, None),
    ("sess-ff14c6c4aab3", 1489, 5571, [(208073, 208075)], None, 28878.1, None),
    ("sess-ff14c6c4aab3", 18972, 679, [(208076, 208113)], None, 973.9, None),
    ("sess-ff14c6c4aab3", 3545, 682, [(208114, 208120)], None, 6776.2, None),
    ("sess-ff14c6c4aab3", 6116, 887, [(208121, 208132)], None, 1880.2, None),
]


def aiperf_rows(turns: int = 5) -> list[dict]:
    """The transcribed rows, the first ``turns`` of each session (a session's prompt grows by every turn: the cut
    keeps the samples' replay short)."""
    rows, seen = [], {}
    for session, length, output, ranges, timestamp, delay, group in AIPERF_ROWS:
        seen[session] = seen.get(session, 0) + 1
        if seen[session] > turns:
            continue
        ids = [i for first, last in ranges for i in range(first, last + 1)]
        assert len(ids) == math.ceil(length / 512), (session, length)
        row = {"session_id": session, "input_length": length, "output_length": output, "hash_ids": ids}
        if timestamp is not None:
            row.update(timestamp=timestamp, group_id=group)
        else:
            row["delay"] = delay
        rows.append(row)
    return rows


# Hand-made agent sessions: LLM spans (start, end ISO-8601 UTC, input tokens, output tokens) of three tasks; the
# third session's fourth span starts before the third ends (an overlap: delay 0) and its prompt shrinks after a
# context reset (new ids).
SPANS = {
    "task-refund-001": [("2026-03-02T10:00:00.000Z", "2026-03-02T10:00:02.400Z", 3100, 180),
                        ("2026-03-02T10:00:03.150Z", "2026-03-02T10:00:05.000Z", 3420, 95),
                        ("2026-03-02T10:00:07.500Z", "2026-03-02T10:00:09.250Z", 3980, 240)],
    "task-search-002": [("2026-03-02T10:00:01.000Z", "2026-03-02T10:00:04.000Z", 5200, 310),
                        ("2026-03-02T10:00:04.600Z", "2026-03-02T10:00:06.100Z", 5650, 120)],
    "task-code-003": [("2026-03-02T10:00:02.000Z", "2026-03-02T10:00:06.000Z", 7000, 400),
                      ("2026-03-02T10:00:06.500Z", "2026-03-02T10:00:08.000Z", 7600, 150),
                      ("2026-03-02T10:00:09.000Z", "2026-03-02T10:00:12.000Z", 8300, 600),
                      ("2026-03-02T10:00:11.500Z", "2026-03-02T10:00:13.000Z", 2100, 90)],
}


def _ms(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000.0


def exgentic_rows(block: int = 512) -> list[dict]:
    rows, next_id = [], 1
    for session, spans in SPANS.items():
        ids: list[int] = []
        previous_input, previous_end = 0, None
        for start, end, tokens, output in sorted(spans):
            if tokens < previous_input:  # a shorter prompt: the context was reset, its blocks are new
                ids = []
            while len(ids) * block < tokens:
                ids.append(next_id)
                next_id += 1
            row: dict = {"session_id": session, "input_length": tokens, "output_length": output, "hash_ids": list(ids)}
            if previous_end is None:
                row["timestamp"] = _ms(start)
            else:
                row["delay"] = max(0.0, _ms(start) - previous_end)
            rows.append(row)
            previous_input, previous_end = tokens, _ms(end)
    return rows


SYSTEM = ("You are the support agent of Northwind Outfitters. Be brief and polite. Look orders up before you answer "
          "about them, and never promise a refund the policy does not allow: refunds within 30 days of delivery, "
          "store credit up to 60 days, nothing after that.")
TOOLS = [
    {"type": "function", "function": {"name": "lookup_order", "description": "Find an order by its number.",
                                      "parameters": {"type": "object", "properties": {"order": {"type": "string"}},
                                                     "required": ["order"]}}},
    {"type": "function", "function": {"name": "issue_refund", "description": "Refund an order to its card.",
                                      "parameters": {"type": "object", "properties": {"order": {"type": "string"},
                                                                                      "amount": {"type": "number"}},
                                                     "required": ["order", "amount"]}}},
]
CONVERSATIONS = {
    "cs-7f3a91_01": [
        ({"role": "user", "content": "Hi, my jacket from order NW-4471 arrived torn. Can I get my money back?"}, 41,
         None),
        ({"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "lookup_order", "arguments": "{\"order\": \"NW-4471\"}"}}]}, None, None),
        ({"role": "tool", "tool_call_id": "call_1", "content": "{\"order\": \"NW-4471\", \"delivered\": "
          "\"2026-02-20\", \"total\": 129.0}"}, 58, 1320.5),
        ({"role": "assistant", "content": "Your order was delivered 10 days ago, so it is within our 30-day refund "
          "window. Shall I refund the full $129.00 to your card?"}, None, None),
        ({"role": "user", "content": "Yes please."}, 36, 8410.0),
    ],
    "cs-b20c4e_02": [
        ({"role": "user", "content": "Do you ship to Canada?"}, 22, None),
        ({"role": "assistant", "content": "Yes, we ship to Canada; delivery takes 5 to 8 business days."}, None, None),
        ({"role": "user", "content": "And returns from Canada, are they free?"}, 30, 15250.25),
    ],
}


def customer_service_rows() -> list[dict]:
    rows = []
    for session, turns in CONVERSATIONS.items():
        history: list[dict] = [{"role": "system", "content": SYSTEM}]
        for message, output, delay in turns:
            history.append({k: v for k, v in message.items() if v is not None})
            if output is not None:  # a request: the conversation so far, then the model's answer of `output` tokens
                rows.append({"session_id": session, "messages": json.loads(json.dumps(history)),
                             "output_length": output, "tools": TOOLS if session.endswith("_01") else None,
                             "delay": delay})
    return rows


def main() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (HERE / "aiperf_agentic_code_3x5.jsonl").write_text(
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in aiperf_rows()))
    (HERE / "dynamo_exgentic_handmade.jsonl").write_text(
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in exgentic_rows()))
    table = pa.Table.from_pylist(customer_service_rows())  # Arrow's types inferred: structs of the union of fields
    pq.write_table(table, HERE / "customer_service_handmade.parquet", compression="zstd")

if __name__ == "__main__":
    main()
