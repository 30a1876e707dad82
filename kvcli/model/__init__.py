"""The model side: presets and the local decoder (prefill with a cached prefix), tokenizers and the chat template,
and the prefill cost curve calibrated on this machine.

May import: kvcli.errors. Not the store, traces or anything above them.
"""
