"""``kvcli replay``: replays traces through one chunk store per chunk size, accounts hits, bytes, round trips and
measured/estimated prefill savings, computes the token-granular upper bound, and renders the report.

May import: kvcli.traces, kvcli.store, kvcli.model, kvcli.prefixkv, kvcli.errors, kvcli.units, kvcli.tables,
kvcli.figures.
Not live, route or cli.
"""
