"""The model side: presets and the local decoder (prefill with a cached prefix), Hugging Face checkpoints
(``checkpoint``, ``hf``, ``hf_tiny``) behind the same interface, ``--model``/``--tokenizer`` resolution (``load``),
tokenizers (tiktoken with kvcli's ChatML template, or a checkpoint's own tokenizer and chat template), the
prefill cost curve calibrated on this machine, and a running serving engine's measured through its HTTP API
(``engine_client``, ``engine_profile``: httpx2).

May import: kvcli.errors, kvcli.units, kvcli.redact, kvcli.provenance, kvcli.prefixkv, kvcli.version, kvcli.outfile
(the profile file). Not the store, traces or anything above them.
"""
