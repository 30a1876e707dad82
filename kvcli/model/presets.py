"""Model presets and what the store needs of a model without its weights: shapes, dtype, model id.

Presets reproduce real models' shapes (KV bytes per token, FLOPs) with seeded random weights (:mod:`kvcli.model.llama`).
Importing this module does not import torch (``kvcli route --prefill-tps`` never needs it): dtypes are known by name
here, and torch is imported only where a torch dtype is made (:func:`parse_dtype`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvcli.errors import BadInputError
from kvcli.units import dtype_bytes, dtype_key, torch_dtype

if TYPE_CHECKING:
    import torch

# dtype names accepted -> torch's name (kvcli.units sizes them); torch's name -> the short name model ids use
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16"}
_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def dtype_short(dtype: torch.dtype | str) -> str:
    """The short name of a dtype (torch's or a name) as model ids spell it: ``torch.bfloat16`` -> ``"bf16"``.
    Raises BadInputError for a dtype kvcli does not support."""
    name = DTYPE_NAMES.get(dtype_key(dtype).lower())
    if name is None:
        raise BadInputError(f"unknown dtype {dtype_key(dtype)!r}; valid: {', '.join(DTYPE_NAMES)}")
    return _SHORT[name]


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of a Llama-style decoder. ``dtype`` is the preset's default dtype name; ``context`` the longest
    prompt the model is made for, tokens (a checkpoint's ``max_position_embeddings``; a preset: its real model's):
    the default length ``kvcli profile`` times prefills up to."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    dtype: str = "bfloat16"
    context: int = 8192

    def kv_bytes_per_token(self, dtype: torch.dtype | str) -> int:
        """Bytes of K and V, all layers, for one token: ``2 * layers * kv_heads * head_dim * element_size``;
        ``dtype`` a torch dtype or its name. Raises BadInputError for an unknown dtype."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes(DTYPE_NAMES.get(dtype_key(dtype).lower(),
                                                                                          dtype))

    def kv_shape(self, tokens: int) -> tuple[int, int, int, int, int]:
        """Shape of the KV of ``tokens`` tokens: ``(layers, 2, kv_heads, tokens, head_dim)``."""
        return (self.layers, 2, self.kv_heads, tokens, self.head_dim)

    def params(self) -> int:
        """Number of parameters (embedding and LM head counted separately: they are untied)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        block = attn + 3 * self.hidden * self.ffn + 2 * self.hidden
        return self.layers * block + 2 * self.vocab * self.hidden + self.hidden


PRESETS: dict[str, ModelConfig] = {c.name: c for c in (
    # 1,024 KV bytes per token in fp32; for tests.
    ModelConfig("tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=32, ffn=128, vocab=100352,
                dtype="float32"),
    # The default for replays on a 2-vCPU machine, in fp32 because every CPU computes it natively: a 1,024-token
    # prefill takes ~1.1 s of CPU time on an AVX2-only AMD EPYC, where bf16 is emulated and takes ~5.9 s (15x its
    # ~0.4 s on AVX512-BF16). 8,192 KV bytes/token: 2 MiB per 256-token chunk. --dtype bfloat16 gives a
    # serving-like KV size where the CPU has bf16 instructions.
    ModelConfig("cpu", layers=8, hidden=512, heads=8, kv_heads=2, head_dim=64, ffn=1408, vocab=100352,
                dtype="float32"),
    ModelConfig("qwen2.5-0.5b", layers=24, hidden=896, heads=14, kv_heads=2, head_dim=64, ffn=4864,
                vocab=151936, rope_theta=1e6, norm_eps=1e-6, context=32768),
    ModelConfig("llama-3.2-1b", layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192,
                vocab=128256, context=131072),
    ModelConfig("llama-3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                vocab=128256),
)}


def get_preset(name: str) -> ModelConfig:
    """The preset called ``name``. Raises BadInputError listing the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise BadInputError(f"unknown model preset {name!r}; valid: {', '.join(PRESETS)}") from None


def check_dtype(name: str) -> str:
    """``"float32"/"fp32"``, ``"bfloat16"/"bf16"``, ``"float16"/"fp16"`` -> torch's name (``"bfloat16"``), without
    importing torch. Raises BadInputError."""
    try:
        torch_name = DTYPE_NAMES[name.lower()]
    except (KeyError, AttributeError):
        raise BadInputError(f"unknown dtype {name!r}; valid: {', '.join(DTYPE_NAMES)}") from None
    return torch_name


def parse_dtype(name: str):
    """``"float32"/"fp32"``, ``"bfloat16"/"bf16"``, ``"float16"/"fp16"`` -> torch dtype (imports torch). Raises
    BadInputError."""
    return torch_dtype(check_dtype(name))


def model_id_for(preset: str, dtype, seed: int) -> str:
    """The model id a built model carries, e.g. ``"kvcli/cpu@seed0:bf16"``: part of every chunk hash's root, so
    KV of two ids never mixes. Known without building the model (for accounted replays and dry runs)."""
    return f"kvcli/{preset}@seed{seed}:{dtype_short(dtype)}"


@dataclass(frozen=True)
class ModelSpec:
    """What the store needs of a model, without its weights: id, per-token KV shape, dtype (a torch dtype, or
    torch's name for it, e.g. ``"bfloat16"``: :func:`model_spec` gives the name, so nothing imports torch for it;
    :func:`kvcli.units.torch_dtype` turns either into a torch dtype)."""

    model_id: str
    kv_shape: tuple[int, int, int, int]  # (layers, 2, kv_heads, head_dim)
    dtype: object


def model_spec(preset: str = "cpu", dtype: str | None = None, seed: int = 0) -> ModelSpec:
    """The spec of ``build_model(preset, dtype, seed=seed)`` (same ``model_id``) from its shapes alone.

    Raises:
        BadInputError: unknown preset or dtype.
    """
    config = get_preset(preset)
    name = check_dtype(dtype if dtype is not None else config.dtype)
    layers, two, heads, _, dim = config.kv_shape(1)
    return ModelSpec(model_id_for(config.name, name, seed), (layers, two, heads, dim), name)
