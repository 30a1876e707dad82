"""Commands over a live cache: ``kvcli warm`` (fill ahead of traffic), ``kvcli inspect`` (read-only summary,
integrity, one prompt's chunk map). ``kvcli purge`` is :mod:`kvcli.store.namespace` (replay cleans up with it too).
Their reports (terminal views and JSON, purge's too) are :mod:`kvcli.live.report`.

May import: kvcli.traces, kvcli.store, kvcli.model, kvcli.prefixkv, kvcli.errors, kvcli.units, kvcli.tables. Not
replay, route or cli.
"""
