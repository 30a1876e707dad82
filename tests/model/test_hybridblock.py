"""vLLM's attention block for hybrid models (kvcli.model.hybridblock), computed by hand from the configs."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcli.model.hf_tiny import tiny_config
from kvcli.model.hybridblock import align_checkpoints, vllm_attention_block
from kvcli.model.load import resolve_spec
from kvcli.model.presets import ModelSpec


def hybrid_folder(tmp_path, **extra) -> str:
    """A config-only tiny Qwen3-Next folder (float32, 2 KV heads of 16; 4 layers, one of them attention)."""
    folder = tmp_path / "hybrid"
    tiny_config("qwen3_next", layers=4, **extra).save_pretrained(folder)
    return str(folder)


def test_qwen3_next_80b_gets_544_token_blocks():
    # bfloat16; attention: 2 KV heads of 256 -> a = 2 * 2 * 256 * 2 = 2,048 B per token and layer; Gated DeltaNet:
    # conv (2 * 16 * 128 + 32 * 128) * 3 = 24,576 and recurrent 32 * 128 * 128 = 524,288 -> 548,864 elements,
    # m = 1,097,728 B; H = 16 * ceil(1,097,728 / (16 * 2,048)) = 16 * ceil(33.5) = 16 * 34 = 544
    spec = resolve_spec("qwen3-next-80b-a3b")
    assert spec.state_shape == (36, 548864)
    assert vllm_attention_block(spec, 16) == 544
    assert vllm_attention_block(spec, 32) == 32 * 17  # k = 32: 32 * ceil(1,097,728 / 65,536) = 32 * 17 = 544
    assert vllm_attention_block(spec, 1024) == 1024  # a larger --block-size is kept


def test_the_b56_tiny_hybrid_gets_48_token_blocks(tmp_path):
    # float32; a = 2 * 2 * 16 * 4 = 256 B; conv (2 * 2 * 16 + 8 * 16) * 3 = 576, recurrent 8 * 16 * 16 = 2,048
    # -> 2,624 elements, m = 10,496 B; H = 16 * ceil(10,496 / 4,096) = 16 * 3 = 48
    spec = resolve_spec(hybrid_folder(tmp_path, linear_num_key_heads=2, linear_key_head_dim=16,
                                      linear_num_value_heads=8, linear_value_head_dim=16))
    assert spec.state_shape == (3, 2624)
    assert vllm_attention_block(spec, 16) == 48


def test_a_model_without_state_keeps_its_block():
    assert vllm_attention_block(resolve_spec("cpu"), 16) is None
    assert vllm_attention_block(ModelSpec("m", (2, 2, 2, 16), "float32", (1, 0)), 16) is None
    with pytest.raises(ValueError, match="block size must be >= 1"):
        vllm_attention_block(resolve_spec("cpu"), 0)


@pytest.mark.parametrize("n,block,step,expected", [
    (90, 48, 8192, [48]),  # one step: the prompt's last block boundary alone
    (47, 48, 8192, []),  # shorter than a block: no state kept
    (96, 48, 8192, [96]),
    (200, 48, 100, [96, 192]),  # steps of floor(100 / 48) * 48 = 96 tokens end on 96, then the last boundary 192
    (200, 48, 40, [48, 96, 144, 192]),  # a step shorter than a block still ends on the next block boundary
])
def test_align_checkpoints(n, block, step, expected):
    assert align_checkpoints(n, block, step) == expected


@given(st.integers(0, 5000), st.integers(1, 600), st.integers(1, 9000))
def test_checkpoints_lie_on_block_boundaries_up_to_the_last(n, block, step):
    got = align_checkpoints(n, block, step)
    assert all(p % block == 0 and 0 < p <= n for p in got) and got == sorted(set(got))
    assert (got[-1] if got else 0) == n // block * block
