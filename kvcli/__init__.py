"""kvcli: how much prefill would a chunk-hash KV cache save on your traffic, at which chunk size, at what cost.

Subpackages follow the data flow (README, "Architecture"): traces -> model (tokenize) -> store (chunks, prefix
hashes, Redis) -> model (prefill) -> replay (report); live (warm, inspect) and route are the other commands; cli is
the thin typer layer. units.py and errors.py are shared by all.
"""
__version__ = "0.1.0"
