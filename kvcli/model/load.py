"""``--model`` and ``--tokenizer`` resolved: a preset name or a local Hugging Face checkpoint folder.

Every command that takes ``--model`` goes through here, so a preset (seeded random weights of a real model's
shapes, :mod:`kvcli.model.presets`) and a checkpoint folder (:mod:`kvcli.model.checkpoint`, :mod:`kvcli.model.hf`)
are interchangeable: both give a :class:`~kvcli.model.presets.ModelSpec` without weights and a model with
``prefill(token_ids, past_kv) -> (logits, kv)``. torch is imported only to build or load a model, or to make a
torch dtype (:func:`resolve_spec`); :func:`check_model`, :func:`resolve_tokenizer` and :func:`kv_bytes_per_token` do
without it.
"""
from __future__ import annotations

from pathlib import Path

from kvcli.model.checkpoint import is_checkpoint_name, read_checkpoint
from kvcli.model.presets import PRESETS, ModelConfig, ModelSpec, get_preset, model_spec
from kvcli.model.tokenize import DEFAULT_TOKENIZER, get_tokenizer
from kvcli.model.tokenizer_base import Tokenizer


def resolve_spec(model: str, dtype: str | None = None, seed: int = 0) -> ModelSpec:
    """The spec (model id, per-token KV shape, dtype) of ``model`` in ``dtype`` (None: its default), without
    loading weights. ``seed`` matters for presets only (a checkpoint's weights are its own).

    Raises:
        BadInputError: unknown preset or dtype; a checkpoint folder that is missing or unsupported.
    """
    if is_checkpoint_name(model):
        return read_checkpoint(model).spec(dtype)
    return model_spec(model, dtype, seed)


def check_model(model: str) -> None:
    """Raise what :func:`resolve_spec` (default dtype) raises for ``model``, without importing torch: BadInputError
    for an unknown preset or a missing or unsupported checkpoint folder."""
    if is_checkpoint_name(model):
        read_checkpoint(model)
    else:
        get_preset(model)


def spec_of(model: str, dtype: str | None = None, seed: int = 0) -> ModelSpec | None:
    """The spec ``--model`` stands for (:func:`resolve_spec`), or None when ``model`` already is a model id as
    ``kvcli inspect`` lists them (``kvcli/cpu@seed0:bf16``, ``hf:llama@<digest>:fp32``: not a preset, not a folder,
    with an ``@``), which names no shapes. Raises BadInputError."""
    if model not in PRESETS and "@" in model and not Path(model).expanduser().is_dir():
        return None
    return resolve_spec(model, dtype, seed)


def model_id_of(model: str, dtype: str | None = None, seed: int = 0) -> str:
    """The model id ``--model`` stands for: a preset's or a checkpoint folder's (:func:`resolve_spec`), or
    ``model`` itself when it already is a model id (:func:`spec_of`). Raises BadInputError."""
    spec = spec_of(model, dtype, seed)
    return model if spec is None else spec.model_id


def load_model(model: str, dtype: str | None = None, device: str = "auto", seed: int = 0):
    """The model to run: a seeded :class:`~kvcli.model.llama.LocalModel` for a preset, an
    :class:`~kvcli.model.hf.HFModel` for a checkpoint folder (transformers is imported only then).

    Raises:
        BadInputError: as :func:`resolve_spec`; a bad device. ModelFailure: it does not fit or cannot be loaded.
    """
    if is_checkpoint_name(model):
        from kvcli.model.hf import load_checkpoint

        return load_checkpoint(model, dtype, device)
    from kvcli.model.llama import build_model

    return build_model(model, dtype, device, seed)


def resolve_tokenizer(tokenizer: str | None, model: str) -> str:
    """The tokenizer to use: ``tokenizer`` when given; else the checkpoint folder ``model`` when it holds a
    tokenizer (its own vocabulary and chat template); else ``cl100k_base``."""
    if tokenizer is not None:
        return tokenizer
    if is_checkpoint_name(model):
        from kvcli.model.hf_tokenizer import has_tokenizer  # a checkpoint's tokenizer: only for a checkpoint

        if has_tokenizer(model):
            return model
    return DEFAULT_TOKENIZER


def open_tokenizer(tokenizer: str | None, model: str) -> Tokenizer:
    """``get_tokenizer(resolve_tokenizer(tokenizer, model))``: the loaded tokenizer; its ``.name`` goes into the
    chunk hashes. Raises BadInputError (an unknown tiktoken name, a folder without a loadable tokenizer)."""
    return get_tokenizer(resolve_tokenizer(tokenizer, model))


def model_shapes(model: str) -> ModelConfig:
    """The shapes of ``model`` (a preset, or a checkpoint folder's config), without weights. Raises
    BadInputError as :func:`resolve_spec`."""
    return read_checkpoint(model).shapes if is_checkpoint_name(model) else get_preset(model)


def kv_bytes_per_token(model: str, dtype: str | None = None) -> int:
    """KV bytes per token of ``model`` (preset or checkpoint) in ``dtype`` (None: its default):
    ``2 * layers * kv_heads * head_dim * element size``. Raises BadInputError."""
    config = model_shapes(model)
    return config.kv_bytes_per_token(dtype if dtype is not None else config.dtype)


def model_context(model: str) -> int:
    """The longest prompt ``model`` (a preset, or a checkpoint folder's ``max_position_embeddings``) takes, tokens,
    without loading weights or torch.

    Raises:
        BadInputError: an unknown preset, a missing or unsupported checkpoint folder.
    """
    return read_checkpoint(model).shapes.context if is_checkpoint_name(model) else get_preset(model).context


def describe(model: str) -> dict:
    """JSON-ready description of ``model`` for reports: ``{"preset": name}`` or ``{"checkpoint": folder,
    "checkpoint_commit": commit or None, "checkpoint_digest": 16 hex}``."""
    if not is_checkpoint_name(model):
        return {"preset": model}
    checkpoint = read_checkpoint(model)
    return {"checkpoint": checkpoint.path, "checkpoint_commit": checkpoint.commit,
            "checkpoint_digest": checkpoint.digest}
