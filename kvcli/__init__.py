"""kvcli: how much prefill would a chunk-hash KV cache save on your traffic, at which chunk size, at what cost.

Module map (one concept each):
  traces    trace readers (native JSONL, Mooncake, ShareGPT, SWE-agent) -> Request with token ids
  tokenize  tiktoken encodings and the chat template
  hashing   prefix-chained chunk hashes (the store's keys)
  serde     KV tensor <-> bytes (safetensors layout)
  server    Redis connections and the embedded server
  layout    key layout and chunk metadata format (names and parsing)
  store     the chunk-hash KV-cache store on Redis: lookup, retrieve, store, LRU capacity
  kvstore   the store interface replay drives, and the layout registry (kvcli, lmcache)
  lmcache   LMCache 0.5.6's Redis layout: key strings, the metadata record, KV bytes (names, parsing)
  lmcache_store  a store in LMCache's layout and lookup protocol (one EXISTS per chunk)
  model     the local Llama-style decoder: prefill(token_ids, past_kv) -> (logits, kv)
  costcurve prefill time as a function of new and cached tokens, fitted from measurements
  radix     token-granular reuse upper bound (unlimited radix tree)
  replay    replays a trace through the store, per chunk size
  report    terminal tables and JSON
  runner    what a replay needs: model, cost curve, trace files, run context
  warm      fill a live cache ahead of traffic (prefill only what is not stored)
  prompts   warm's input: prompt files, trace files and stdin -> tokenized Requests
  inspection read a live cache without changing it: summary, integrity
  chunkmap  one prompt's chunk map on a live cache: where its hit run breaks, and why
  inspect_lmcache  read an LMCache Redis backend without changing it: chunks, bytes, orphans by model
  purge     delete kvcli's keys of one namespace, nothing else
  route     KV-cache-aware routing simulation across serving nodes (discrete events)
  nodecache the simulated nodes' LRU chunk caches and the hash -> node-bitmask index
  policies  routing policies (registry)
  cachemanager  the Redis-backed KV cache manager index used by the cache-manager policy
  route_report  routing tables, JSON and plot
  cli, cli_cache, cli_route   the typer command line (thin)
"""
__version__ = "0.1.0"
