"""What a serving engine reports about its KV cache: the KV events vLLM, SGLang and Mooncake Store publish over
ZMQ (events.py decodes one payload into typed records; recording.py reads files of decoded batches, kvcli's own
recordings among them; record.py subscribes and writes such a recording), and the prompt tokens it reported cached
per request (reports.py). No Redis, no model.

May import: kvcli.errors, kvcli.units, kvcli.traces (its JSONL line reader) (and msgpack, pyzmq). Nothing else of
kvcli.
"""
