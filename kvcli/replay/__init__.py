"""``kvcli replay``: the replay of a trace on Redis and a model, and its accounting: one chunk store per chunk size,
hits, bytes, round trips and measured/estimated prefill savings, the capacity planner run on the chunk ids the
curve kept (its simulations are :mod:`kvcli.sim`), and the report.

May import: kvcli.sim, kvcli.traces, kvcli.store, kvcli.model, kvcli.prefixkv, kvcli.errors, kvcli.units,
kvcli.tables, kvcli.figures.
Not live, route or cli.
"""
