"""``kvcli stats``: a workload at a glance, no Redis: requests, sessions, prompt lengths, and the prompt tokens a
prefix cache could reuse.

May import: kvcli.errors, kvcli.units, kvcli.tables, kvcli.traces, kvcli.model (the tokenizer) and
kvcli.replay.upper_bound (the token radix of replay's upper bound). Not store, live, route or cli.
"""
