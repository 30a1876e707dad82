"""The per-node GPU tier (kvcli.model.kvmemory) by hand, against vLLM's published memory profile, and the devices a
node needs for a model's weights and one context."""
from __future__ import annotations

import pytest

from kvcli.model.checkpoint import is_checkpoint_name, read_checkpoint
from kvcli.model.hardware import GIB, get_accelerator
from kvcli.model.kvmemory import GPU_MEMORY_UTILIZATION, RESERVE_BYTES, gpu_tier
from kvcli.model.presets import get_preset


def model_shapes(model: str):
    return read_checkpoint(model).shapes if is_checkpoint_name(model) else get_preset(model)


def _tier(model: str, hardware: str = "h100-sxm"):
    shapes, acc = model_shapes(model), get_accelerator(hardware)
    return gpu_tier(acc.label, acc.memory_bytes, shapes.params() * 2, shapes.kv_bytes_per_token("bfloat16"),
                    shapes.context, f"--hardware {hardware}")


def test_llama_3_8b_on_an_h100_by_hand():
    tier = _tier("llama-3-8b")
    assert tier is not None and tier.devices == 1
    weights = 8_030_261_248 * 2  # Llama-3-8B's parameters in bf16: vLLM's "model weights take 14.96GiB"
    assert tier.weights_bytes == weights and weights / GIB == pytest.approx(14.96, abs=0.005)
    kv = int(80 * GIB * 0.9 - weights - 3 * GIB)
    assert (tier.kv_bytes, tier.tokens) == (kv, kv // (32 * 2 * 8 * 128 * 2))
    assert (tier.kv_bytes / GIB, tier.tokens) == (pytest.approx(54.04, abs=0.01), 442_715)
    # vLLM measured 53.29 GiB for KV on one (79.22 GiB of it visible to CUDA): this formula is within 1.5%
    assert tier.kv_bytes / GIB == pytest.approx(53.29, rel=0.015)
    assert tier.formula() == ("NVIDIA H100 SXM5 80GB: 80.0 GiB x 0.9 - 15.0 GiB weights - 3.0 GiB runtime and "
                              "activations")
    assert (GPU_MEMORY_UTILIZATION, RESERVE_BYTES) == (0.9, 3 * GIB)


def test_a_node_has_the_fewest_devices_that_hold_the_weights_and_one_context():
    seventy = _tier("llama-3.1-70b")  # 131.4 GiB of weights; 2 devices leave 6.6 GiB, under one 128k context
    assert seventy is not None and seventy.devices == 4
    assert seventy.kv_bytes == int(4 * 80 * GIB * 0.9 - seventy.weights_bytes - 4 * 3 * GIB)
    assert seventy.tokens >= get_preset("llama-3-8b").context
    assert _tier("deepseek-v3") is None  # 1.25 TiB of bf16 weights: no node of 8 H100s holds them


def test_a_device_measured_alone_never_gets_a_node_of_several():
    shapes = model_shapes("llama-3.1-70b")
    assert gpu_tier("GPU", 80 * GIB, shapes.params() * 2, 327_680, shapes.context, "profile", max_devices=1) is None


@pytest.mark.parametrize("kwargs", [{"utilization": 0.0}, {"utilization": 1.5}, {"reserve_bytes": -1}])
def test_bad_inputs_are_refused(kwargs):
    with pytest.raises(ValueError, match="bad GPU tier inputs"):
        gpu_tier("GPU", 80 * GIB, 1, 1, 1, "x", **kwargs)
