"""Cache simulations over dense chunk-id streams: curves, bounds, eviction policies, tiers; no Redis, no model.
The one LRU over chunks (``lru``) that the store's capacity limit and the routing simulation's node caches use
too; dense chunk ids (``chunkids``, ``numbering``) and the recorded stream (``stream``); the hit curves over every
capacity and TTL (``stackdist``, ``curve``, ``ttlcurve``); the token-granular upper bound (``upper_bound``), reuse
beyond a prefix (``blend``), the optimal eviction (``optimal``), other eviction policies (``eviction``) and tier
hierarchies (``tiers``); a vLLM engine's own prefix cache: its block pool (``blockpool``) and its scheduler over
it (``scheduler``).

May import: kvcli.errors, kvcli.units and kvcli.traces (the upper bound's Request and synthesized block tokens:
numpy, no tokenizer), and numpy. Not kvcli.store, kvcli.model or anything above them: the store imports the LRU from
here, and importing any module here loads neither redis nor torch (tests/test_layout.py).
"""
