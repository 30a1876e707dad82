"""Named accelerators and their public figures: dense tensor FLOP/s, HBM bandwidth and capacity, the host link.

Every figure is the vendor's published peak, from the source each entry names (docs/hardware.md lists them with
the derivations). Device memory is the vendor's "80GB" read as memory capacities are written (JEDEC's convention for
memory: GB = 2**30 bytes): an H100 80GB holds 80 GiB of HBM3, of which CUDA shows 79.22 GiB (vLLM's memory profile
of Llama-3-8B on one, github.com/vllm-project/vllm/pull/10511). Peaks "with sparsity" are halved to dense: prefill
runs dense matrix multiplies. The host link is one direction (host to device), the bus's theoretical rate: PCIe 5.0
x16 64 GB/s (the "128 GB/s" vendors quote counts both directions), PCIe 4.0 x16 32 GB/s, NVLink-C2C 450 GB/s (of
900 GB/s both ways). What a pageable copy reaches is less (about 70-80% on PCIe); a profile
(:mod:`kvcli.model.profile`) measures it. The B200's HBM bandwidth is NVIDIA's HGX B200 per-GPU figure, 7.7 TB/s (the
8 TB/s NVIDIA gives is a GB200's GPU's): a B200's driver reports a 7,680-bit bus at 3,996 MHz, 7.67 TB/s
(github.com/pytorch/ao/pull/4002).

What share of the dense peak a prefill reaches, per accelerator and precision, is :mod:`kvcli.model.utilization`'s;
:mod:`kvcli.model.roofline` prices a prefill on one of these from the exact FLOPs and bytes of the model's shapes.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvcli.errors import BadInputError

TERA = 1e12
GB = 1e9
GIB = 2 ** 30


@dataclass(frozen=True)
class Accelerator:
    """One accelerator's published peaks.

    Attributes:
        name: the ``--hardware`` name ("h100-sxm").
        label: the product ("NVIDIA H100 SXM5 80GB").
        bf16_flops: dense BF16/FP16 tensor FLOP/s.
        fp8_flops: dense FP8 tensor FLOP/s (None: no FP8 tensor cores).
        hbm_bytes_per_second: memory bandwidth, bytes/s.
        memory_bytes: device memory, bytes (the vendor's figure in GiB: module docstring).
        host_link: the link to the host, named ("PCIe 5.0 x16").
        host_bytes_per_second: that link's rate host to device, one direction, bytes/s.
        sources: where the figures come from (URLs of the vendor's specification pages).
    """

    name: str
    label: str
    bf16_flops: float
    fp8_flops: float | None
    hbm_bytes_per_second: float
    memory_bytes: float
    host_link: str
    host_bytes_per_second: float
    sources: tuple[str, ...]

    def peak_flops(self, dtype: str) -> float:
        """Dense tensor FLOP/s for a compute dtype ("bfloat16", "float16", "float8").

        Raises:
            BadInputError: a dtype this accelerator has no tensor-core figure for (float32; float8 on an A100).
        """
        if dtype in ("bfloat16", "float16"):
            return self.bf16_flops
        if dtype == "float8" and self.fp8_flops is not None:
            return self.fp8_flops
        remedy = "--precision auto" if dtype == "float8" else "--dtype bfloat16"
        raise BadInputError(f"--hardware {self.name} has no dense tensor FLOP/s for {dtype}: price a bfloat16 or "
                            f"float16 model ({remedy})")

    def to_dict(self) -> dict:
        """JSON-ready, unit-suffixed."""
        return {"name": self.name, "label": self.label, "bf16_flops_per_second": self.bf16_flops,
                "fp8_flops_per_second": self.fp8_flops, "hbm_bytes_per_second": self.hbm_bytes_per_second,
                "memory_bytes": self.memory_bytes, "host_link": self.host_link,
                "host_bytes_per_second": self.host_bytes_per_second, "sources": list(self.sources)}


PCIE5_X16 = ("PCIe 5.0 x16", 64 * GB)
"""The host link of most accelerators listed (one direction, the bus's theoretical rate): the link a priced replay
assumes when no accelerator is named (``--prefill-tps``)."""
_PCIE5, _PCIE4 = PCIE5_X16, ("PCIe 4.0 x16", 32 * GB)

ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in (
    Accelerator("h100-sxm", "NVIDIA H100 SXM5 80GB", 989.4 * TERA, 1978.9 * TERA, 3.35e12, 80 * GIB, *_PCIE5,
                ("https://www.nvidia.com/en-us/data-center/h100/",)),
    Accelerator("h200", "NVIDIA H200 SXM 141GB", 989.4 * TERA, 1978.9 * TERA, 4.8e12, 141 * GIB, *_PCIE5,
                ("https://www.nvidia.com/en-us/data-center/h200/",)),
    Accelerator("gh200", "NVIDIA GH200 Grace Hopper (96GB HBM3)", 989.4 * TERA, 1978.9 * TERA, 4.0e12, 96 * GIB,
                "NVLink-C2C", 450 * GB, ("https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/",)),
    Accelerator("b200", "NVIDIA B200 180GB (HGX B200)", 2250 * TERA, 4500 * TERA, 7.7e12, 180 * GIB, *_PCIE5,
                ("https://www.nvidia.com/en-us/data-center/hgx/", "https://github.com/pytorch/ao/pull/4002")),
    Accelerator("a100-80gb", "NVIDIA A100 SXM4 80GB", 312 * TERA, None, 2.039e12, 80 * GIB, *_PCIE4,
                ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                 "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",)),
    Accelerator("l40s", "NVIDIA L40S 48GB", 362.05 * TERA, 733 * TERA, 864 * GB, 48 * GIB, *_PCIE4,
                ("https://www.nvidia.com/en-us/data-center/l40s/",)),
    Accelerator("mi300x", "AMD Instinct MI300X 192GB", 1307.4 * TERA, 2614.9 * TERA, 5.3e12, 192 * GIB, *_PCIE5,
                ("https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",)),
)}


def get_accelerator(name: str) -> Accelerator:
    """The accelerator called ``name`` (``kvcli hardware`` lists them).

    Raises:
        BadInputError: an unknown name (the message lists the known ones).
    """
    try:
        return ACCELERATORS[name.strip().lower()]
    except KeyError:
        raise BadInputError(f"unknown --hardware {name!r}; known: {', '.join(ACCELERATORS)} "
                            f"(kvcli hardware lists them)") from None
