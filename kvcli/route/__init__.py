"""``kvcli route``: discrete-event simulation of KV-cache-aware routing across serving nodes (node caches on the
LRU over chunks and the tiers of :mod:`kvcli.sim`), the routing policies, the Redis cache-manager index, and the
report and plot.

May import: kvcli.sim, kvcli.traces, kvcli.store, kvcli.model, kvcli.errors, kvcli.units, kvcli.tables,
kvcli.figures. Not replay, live or cli.
"""
