"""Trace analysis without a live cache: ``kvcli stats`` (a workload at a glance: requests, sessions, prompt lengths,
the prompt tokens a prefix cache could reuse), ``kvcli explain`` (why each request reused what it did, by cause,
and where its prompt diverged) and ``kvcli audit`` (explain beside what an engine reported, each token of
difference given a cause).

May import: kvcli.errors, kvcli.units, kvcli.tables, kvcli.traces, kvcli.model (the tokenizer, model specs),
kvcli.sim (the token radix of replay's upper bound, the LRU, the TTL rules), kvcli.store (chunk hashes, the
engines' block hashes, the store's capacity rule) and kvcli.engine (an engine's per-request reports and KV events).
Not replay, live, route or cli.
"""
