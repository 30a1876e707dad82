"""A local Hugging Face checkpoint folder without its weights loaded: shapes, default dtype, identity.

What the store needs of a checkpoint (its :class:`~kvcli.model.presets.ModelSpec`) comes from ``config.json``
(read with transformers' ``AutoConfig``, offline): the per-token KV shape ``(layers, 2, kv_heads, head_dim)``
with ``kv_heads = num_key_value_heads`` (grouped-query attention; ``num_attention_heads`` when absent) and
``head_dim`` from the config (``hidden_size / num_attention_heads`` when absent), the default dtype (the
config's ``dtype``/``torch_dtype``; float32 when it has none) and the context (``max_position_embeddings``;
8,192 when absent).

Model id (part of every chunk hash's root): ``"hf:<model_type>@<16 hex>:<dtype>"``, e.g.
``"hf:llama@3f0c9a1d2b4e5f60:bf16"``. The digest is xxh3-64 over, in order: the source commit when the folder
records one (a Hub cache snapshot ``.../snapshots/<40-hex commit>``, or ``.cache/huggingface/download/
config.json.metadata`` of a ``local_dir`` download); the bytes of ``config.json``; and for every weight file
(``*.safetensors``, ``*.bin``, ``*.pt``, ``*.pth``, sorted by name) its name, size and the bytes of 16 blocks of
64 KiB spread evenly over it (first and last included). So two checkpoints never share chunks: fine-tunes of one
base have identical configs and file sizes but different weights, which the sampled blocks tell apart, while
reading 1 MiB per weight file, not the 16 GB of an 8B model. Copies of one checkpoint in two folders share.

Shapes of every decoder family (:mod:`kvcli.model.hfconfig`): grouped-query attention, sliding-window and mixed
layers, latent attention (MLA), experts, linear-attention / Mamba layers. A folder with only ``config.json`` is
enough for its bytes and FLOPs (no weights: nothing to run). Refused with a one-line error: encoder-decoders and
layer types kvcli does not know.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from kvcli.errors import BadInputError
from kvcli.model.configs import SOURCES, config_preset_folder
from kvcli.model.hf_offline import one_line, transformers
from kvcli.model.hfconfig import shapes_from_config
from kvcli.model.presets import DTYPE_NAMES, PRESETS, ModelConfig, ModelSpec, dtype_short, parse_dtype

if TYPE_CHECKING:
    import torch

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_SAMPLES, _SAMPLE_BYTES = 16, 64 * 1024


def is_checkpoint_name(model: str) -> bool:
    """Whether ``--model`` names a checkpoint folder rather than a preset: a config-only preset
    (:mod:`kvcli.model.configs`), an existing folder, or anything with a path separator (so a mistyped path is
    reported as a missing folder, not as an unknown preset)."""
    if config_preset_folder(model) is not None:
        return True
    return model not in PRESETS and ("/" in model or "\\" in model or Path(model).expanduser().is_dir())


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder's config, read without its weights. Build it with :func:`read_checkpoint`.

    Attributes:
        path: the folder (absolute). hf_config: the transformers config. shapes: its shapes as a
        :class:`ModelConfig` (``name`` is ``"hf:<model_type>@<digest>"``). default_dtype: torch dtype name.
        digest: 16 hex digits (module docstring). commit: the source commit, or None. weight_bytes: total size
        of the weight files.
    """

    path: str
    hf_config: Any
    shapes: ModelConfig
    default_dtype: str
    digest: str
    commit: str | None
    weight_bytes: int

    def model_id(self, dtype: torch.dtype) -> str:
        """``"hf:<model_type>@<digest>:<dtype>"``: the id every chunk hash of this checkpoint in ``dtype`` has."""
        return f"{self.shapes.name}:{dtype_short(dtype)}"

    def dtype(self, name: str | None) -> torch.dtype:
        """``name`` parsed (:func:`parse_dtype`), or the checkpoint's default dtype when None."""
        return parse_dtype(name if name is not None else self.default_dtype)

    def spec(self, dtype: str | None = None) -> ModelSpec:
        """The :class:`ModelSpec` (model id, per-token KV shape, dtype, a hybrid model's state shape) of this
        checkpoint in ``dtype``."""
        torch_dtype = self.dtype(dtype)
        layers, two, heads, _, dim = self.shapes.kv_shape(1)
        return ModelSpec(self.model_id(torch_dtype), (layers, two, heads, dim), torch_dtype, self.shapes.state_shape)


@functools.lru_cache(maxsize=8)
def read_checkpoint(path: str) -> Checkpoint:
    """Read the config of checkpoint folder ``path``, or of the config-only preset of that name (cached per
    ``path`` for the process).

    Raises:
        BadInputError: no such folder, no ``config.json``, a config transformers cannot read, or an architecture
            kvcli does not support (module docstring); each one line, naming the folder.
    """
    folder = (config_preset_folder(path) or Path(path).expanduser()).resolve()
    if not folder.is_dir():
        raise BadInputError("no such checkpoint folder (--model takes a preset name or a local Hugging Face "
                            f"checkpoint folder; presets: {', '.join([*PRESETS, *SOURCES])})", path=path)
    if not (folder / "config.json").is_file():
        raise BadInputError("not a Hugging Face checkpoint: no config.json in this folder", path=path)
    tf = transformers()
    try:
        config = tf.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # ValueError for an unknown model_type, OSError/JSON errors for a bad file
        raise BadInputError(f"cannot read config.json: {one_line(exc)}", path=path) from None
    text = config.get_text_config(decoder=True)
    _check_supported(config, text, path)
    commit = _commit(folder)
    weights = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    digest = _digest(folder, commit, weights)
    try:
        shapes = shapes_from_config(f"hf:{config.model_type}@{digest}", text, _default_dtype(config))
    except BadInputError as exc:
        raise BadInputError(f"{config.model_type} checkpoints are not supported: {exc}", path=path) from None
    return Checkpoint(str(folder), config, shapes, shapes.dtype, digest, commit,
                      sum(p.stat().st_size for p in weights))


def _check_supported(config: Any, text: Any, path: str) -> None:
    if getattr(config, "is_encoder_decoder", False):
        raise BadInputError(f"{config.model_type} checkpoints are not supported: an encoder-decoder model; kvcli "
                            "needs a decoder-only model", path=path)


def _default_dtype(config: Any) -> str:
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
    return name if name in DTYPE_NAMES else "bfloat16"


def _commit(folder: Path) -> str | None:
    if folder.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", folder.name):
        return folder.name
    meta = folder / ".cache" / "huggingface" / "download" / "config.json.metadata"
    try:
        first = meta.read_text(encoding="utf-8").split("\n", 1)[0].strip()
    except OSError:
        return None
    return first if re.fullmatch(r"[0-9a-f]{40}", first) else None


def _digest(folder: Path, commit: str | None, weights: list[Path]) -> str:
    h = xxhash.xxh3_64()
    h.update(f"commit={commit or ''}\0".encode())
    h.update((folder / "config.json").read_bytes())
    for path in weights:
        size = path.stat().st_size
        h.update(f"\0{path.name}\0{size}\0".encode())
        with open(path, "rb") as f:
            for offset in sorted({max(0, size - _SAMPLE_BYTES) * i // (_SAMPLES - 1) for i in range(_SAMPLES)}):
                f.seek(offset)
                h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()
