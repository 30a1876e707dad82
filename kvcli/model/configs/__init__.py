"""Config-only presets: the ``config.json`` of current open models, trimmed to the fields that set their shapes,
for pricing bytes and FLOPs without weights (``--model deepseek-v3 --measure 0 --payload accounted``).

Each folder holds one ``config.json`` copied from its model's Hugging Face repository (:data:`SOURCES`: the
file each was copied from). The folder is read as any checkpoint folder (:func:`kvcli.model.checkpoint.
read_checkpoint`); it has no weights, so nothing runs the model.
"""
from __future__ import annotations

from pathlib import Path

#: preset name -> the config.json its folder copies (Hugging Face repository, main branch).
SOURCES = {
    "deepseek-v3": "https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json",
    "gpt-oss-120b": "https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json",
    "gemma-3-27b": "https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json (its text_config)",
    "qwen3-next-80b-a3b": "https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json",
    "llama-3.1-70b": "https://huggingface.co/meta-llama/Llama-3.1-70B-Instruct/blob/main/config.json",
    "qwen3-32b": "https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json",
}


def config_preset_folder(name: str) -> Path | None:
    """The folder of config-only preset ``name`` (:data:`SOURCES`), or None when ``name`` is not one."""
    return Path(__file__).parent / name if name in SOURCES else None
