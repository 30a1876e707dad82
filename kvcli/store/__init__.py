"""The chunk-hash KV-cache store: chunk hashes, key layout and metadata, KV serialization, the store on Redis
(lookup, retrieve, store; its capacity kept by :mod:`kvcli.sim.lru`) and the port its batcher drives it through,
namespace scans, connections, the embedded server and a local cluster for tests; the store interface replay drives
(kvstore) and LMCache's Redis layouts with a store in each (lmcache, lmcache_mp, lmcache_store).

May import: kvcli.errors, kvcli.units, kvcli.redact, kvcli.prefixkv, kvcli.sim (the LRU over chunks) (and
torch/numpy/redis/xxhash). Nothing else of kvcli.
"""
