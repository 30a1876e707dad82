"""The KV cache a serving engine leaves on its accelerators: the per-node GPU tier a priced replay assumes.

An engine such as vLLM sizes its KV cache at start-up (``gpu_memory_utilization``, vLLM's engine arguments): of
each device's memory it may use a share, the utilization (default 0.9); the weights, the runtime's own memory
(CUDA context, NCCL and library workspaces) and the peak activations of a profiling forward pass come off it, and
the rest holds KV blocks. Per node of ``n`` devices (tensor parallel)::

    usable   = n x device memory x utilization
    KV bytes = usable - weights - n x reserve
    tokens   = KV bytes // KV bytes per token

The reserve, 3 GiB per device, is what vLLM measured besides the weights on one H100 80GB serving Llama-3-8B:
non-torch memory 1.79 GiB and a PyTorch activation peak of 1.26 GiB, leaving 53.29 GiB of its 71.29 GiB for KV
(the memory profile printed in github.com/vllm-project/vllm/pull/10511). The formula gives 54.0 GiB there, with
80 GiB of HBM where CUDA shows 79.22 GiB.

The devices per node: the fewest of 1, 2, 4, 8 whose KV holds one context of the model (``ModelConfig.context``
tokens), as vLLM refuses to start when its KV cannot hold ``max_model_len`` tokens; none of them (the weights do not
fit 8 devices) gives no tier.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvcli.units import fmt_bytes

GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's default ``gpu_memory_utilization``: the share of each device's memory the engine may use."""
RESERVE_BYTES = 3 * 2 ** 30
"""Per device, for the runtime and the activations of a forward pass (module docstring: vLLM's profile)."""
TENSOR_PARALLEL = (1, 2, 4, 8)
"""Devices per node tried, fewest first (an 8-GPU node at most)."""


@dataclass(frozen=True)
class GpuTier:
    """The KV memory of one serving node (module docstring).

    Attributes:
        device: the accelerator, named ("NVIDIA H100 SXM5 80GB").
        devices: devices per node (tensor parallel).
        memory_bytes: one device's memory, bytes.
        utilization: the share of it the engine may use.
        weights_bytes: the model's weights, bytes (every parameter at the model's element size).
        reserve_bytes: per device, for the runtime and activations, bytes.
        kv_bytes_per_token: the model's KV per token, bytes (at the cache's element size).
        source: where the device's memory comes from ("--hardware h100-sxm", "the profile's device").
    """

    device: str
    devices: int
    memory_bytes: float
    utilization: float
    weights_bytes: int
    reserve_bytes: int
    kv_bytes_per_token: int
    source: str

    @property
    def kv_bytes(self) -> int:
        """Bytes left for KV on the node (0 when the weights and reserve take it all)."""
        usable = self.devices * self.memory_bytes * self.utilization
        return max(0, int(usable - self.weights_bytes - self.devices * self.reserve_bytes))

    @property
    def tokens(self) -> int:
        """Tokens of KV the node holds."""
        return self.kv_bytes // max(self.kv_bytes_per_token, 1)

    def formula(self) -> str:
        """The figures that make :attr:`kv_bytes`, as a reader checks them: "H100 ...: 80 GiB x 0.9 - 15.0 GiB
        weights - 3 GiB reserve"."""
        per = f"{self.devices} x " if self.devices > 1 else ""
        return (f"{self.device}: {per}{fmt_bytes(self.memory_bytes)} x {self.utilization:g} - "
                f"{fmt_bytes(self.weights_bytes)} weights - {per}{fmt_bytes(self.reserve_bytes)} runtime and "
                f"activations")

    def to_dict(self) -> dict:
        """JSON-ready, unit-suffixed."""
        return {"device": self.device, "devices": self.devices, "memory_bytes": self.memory_bytes,
                "utilization": self.utilization, "weights_bytes": self.weights_bytes,
                "reserve_bytes": self.reserve_bytes, "kv_bytes_per_token": self.kv_bytes_per_token,
                "kv_bytes": self.kv_bytes, "tokens": self.tokens, "source": self.source, "formula": self.formula()}


def gpu_tier(device: str, memory_bytes: float, weights_bytes: int, kv_bytes_per_token: int, context_tokens: int,
             source: str, utilization: float = GPU_MEMORY_UTILIZATION, reserve_bytes: int = RESERVE_BYTES,
             max_devices: int = TENSOR_PARALLEL[-1]) -> GpuTier | None:
    """The node of the fewest devices (:data:`TENSOR_PARALLEL`, at most ``max_devices``) whose KV holds
    ``context_tokens`` tokens, or None when none does (module docstring).

    Args:
        device: the accelerator's name. memory_bytes: one device's memory, bytes.
        weights_bytes: the model's weights, bytes. kv_bytes_per_token: its KV per token, bytes.
        context_tokens: the longest prompt the model serves, tokens (one must fit).
        source: where ``memory_bytes`` comes from, for the report.
        utilization: the share of a device the engine may use, in (0, 1].
        reserve_bytes: per device, for the runtime and activations.
        max_devices: 1 for a device measured alone (a profile).

    Raises:
        ValueError: ``utilization`` outside (0, 1], or a size below 0.
    """
    if not 0 < utilization <= 1 or min(memory_bytes, weights_bytes, reserve_bytes, kv_bytes_per_token) < 0:
        raise ValueError(f"bad GPU tier inputs: utilization {utilization}, memory {memory_bytes}, weights "
                         f"{weights_bytes}, reserve {reserve_bytes}, KV per token {kv_bytes_per_token}")
    for devices in (n for n in TENSOR_PARALLEL if n <= max_devices):
        tier = GpuTier(device, devices, memory_bytes, utilization, weights_bytes, reserve_bytes, kv_bytes_per_token,
                       source)
        if tier.tokens >= max(context_tokens, 1):
            return tier
    return None
