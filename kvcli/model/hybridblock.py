"""The attention block a vLLM engine uses for a hybrid (attention + Mamba / linear-attention) model, from its shapes.

vLLM keeps one page size for every KV cache group, so for a hybrid model it enlarges the attention block until an
attention page holds a Mamba state (vLLM 0.33.0 ``vllm/platforms/interface.py``
``Platform._align_hybrid_block_size``, run from ``update_block_size_for_backend`` after
``HybridAttentionMambaModelConfig.verify_and_update_config``), per layer::

    attention page of one token  a = 2 * kv_heads * head_dim * element bytes
    Mamba page                   m = state elements * element bytes        (conv + temporal state, one sequence)
    alignment                    k = max(16, --block-size)                 (FlashAttention / Triton: MultipleOf(16))
    attention block              H = max(--block-size, 16 * ceil(k * ceil(m / (k * a)) / 16))

Assumed as vLLM runs by default: tensor parallel 1, ``--kv-cache-dtype`` and ``--mamba-cache-dtype`` auto (the
model's dtype for both), no speculative tokens, a FlashAttention or Triton attention backend and no FlashInfer Gated
DeltaNet prefill checkpoints (which would also align the block to 64). Qwen3-Next-80B-A3B in bfloat16 (2 KV heads of
256; 548,864 state elements): ``a`` = 2,048 B, ``m`` = 1,097,728 B, ``H`` = 16 x 34 = 544 tokens.

With prefix caching, vLLM runs a hybrid model in its ``"align"`` Mamba cache mode (``MambaModelConfig``): a Mamba
state is kept only where a scheduler step ends on a block boundary (``Scheduler._mamba_block_aligned_split``: the
last block boundary of each prompt, and every block-aligned end of a chunked prefill), and a request resumes only
from such a boundary. :func:`align_checkpoints` lists them.
"""
from __future__ import annotations

from kvcli.model.presets import ModelSpec
from kvcli.units import dtype_bytes

#: the smallest kernel block of vLLM's FlashAttention and Triton backends (``MultipleOf(16)``), tokens.
KERNEL_BLOCK = 16
#: the vLLM version whose rule this is.
VLLM_VERSION = "0.33.0"
#: vLLM 0.33.0's default ``max_num_batched_tokens`` for its OpenAI server on a GPU of 70 GiB or more
#: (``vllm/engine/arg_utils.py`` ``default_max_num_batched_tokens``), tokens per scheduler step.
DEFAULT_STEP_TOKENS = 8192


def vllm_attention_block(spec: ModelSpec, block_size: int = 16) -> int | None:
    """The attention block size (tokens) vLLM gives ``spec``'s model when started with ``--block-size
    block_size`` (module docstring), or None when the model has no Mamba / linear-attention layer (the block size
    stays ``block_size``).

    Raises:
        ValueError: ``block_size`` < 1.
    """
    if block_size < 1:
        raise ValueError(f"block size must be >= 1, got {block_size}")
    if not spec.state_shape or not spec.state_shape[-1]:
        return None
    element = dtype_bytes(spec.dtype)
    _, _, kv_heads, head_dim = spec.kv_shape
    attention = 2 * kv_heads * head_dim * element
    mamba = spec.state_shape[-1] * element
    align = max(KERNEL_BLOCK, block_size)
    block = align * -(-mamba // (align * attention))
    block = KERNEL_BLOCK * -(-block // KERNEL_BLOCK)
    return max(block_size, block)


def align_checkpoints(prompt_tokens: int, block: int, step_tokens: int = DEFAULT_STEP_TOKENS) -> list[int]:
    """The positions (tokens, ascending) where vLLM's align mode keeps a Mamba state of a ``prompt_tokens`` prompt
    computed from scratch: each block-aligned end of a chunked-prefill step (every ``floor(step_tokens / block)``
    blocks, at least one) below the prompt's last block boundary, and that boundary ``floor(n / block) * block``
    (none for a prompt shorter than one block).

    Raises:
        ValueError: ``block`` or ``step_tokens`` < 1.
    """
    if block < 1 or step_tokens < 1:
        raise ValueError(f"block and step must be >= 1 token, got {block} and {step_tokens}")
    last = prompt_tokens // block * block
    step = max(1, step_tokens // block) * block
    return [*range(step, last, step), last] if last else []
