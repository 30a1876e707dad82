"""Prefill time on a named accelerator, from the model's exact FLOPs and bytes: a roofline.

Per transformer layer, a prefill of ``n`` new tokens after ``c`` cached ones takes the longer of its compute and
its memory traffic (Williams, Waterman and Patterson 2009, "Roofline: an insightful visual performance model",
CACM 52(4)):

    t_layer = max(F_layer / (peak * mfu), B_layer / hbm_bandwidth)
    t(n, c) = sum over layers of t_layer + max(F_head / (peak * mfu), B_head / hbm_bandwidth)   (0 when n = 0)

``F_layer`` is :func:`kvcli.model.flops.layer_flops` (projections, MLP or active experts, causal or windowed
attention pairs), ``F_head`` one row of LM head; ``B_layer`` the bytes the layer moves,
:func:`kvcli.model.traffic.layer_bytes`, by family: its weights (the routed experts its tokens touch, for a
mixture of experts), the cache it reads and writes (KV; MLA's latent; a sliding layer's window; a linear layer's
state instead) and its activations in and out, at the model's element size except the KV cache, at its own
(``kv_element_bytes``: 1 for ``--kv-dtype fp8``, as an engine with ``--kv-cache-dtype fp8`` reads and writes 1-byte
KV in attention; fp8's per-layer scales, a few bytes, are left out); the head reads its ``vocab x hidden``
weights. Layers of one kind cost alike, so the sum runs over :meth:`~kvcli.model.presets.ModelConfig.
layer_classes`. ``peak`` is the accelerator's dense tensor FLOP/s for the compute dtype
(:mod:`kvcli.model.hardware`).

``mfu`` (model FLOPs utilization) is what a real engine reaches of that peak in prefill: by default the published
utilization of the accelerator at the compute dtype's precision, with its interval
(:func:`kvcli.model.utilization.utilization`: per accelerator, bf16 and fp8, each from its published figures;
docs/hardware.md). A fixed per-call cost (kernel launches, scheduling: TensorRT-LLM's first-token latencies show 7-16
ms at 128 tokens, where the roofline says 1-3 ms) is left out: it is paid with or without a cache hit, so it cancels
in what a hit saves, and only makes the share of prefill saved look larger.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvcli.errors import BadInputError
from kvcli.model.flops import layer_flops, lm_head_flops
from kvcli.model.hardware import Accelerator
from kvcli.model.presets import ModelConfig
from kvcli.model.traffic import head_bytes, layer_bytes
from kvcli.model.utilization import Utilization, precision_of, utilization

#: The lowest ``--mfu`` taken: a prefill at 1% of the dense peak is already far below any served model's; smaller
#: values only make every figure huge (1e-300 priced a saving at 2.6e300 s).
MIN_MFU = 0.01


@dataclass(frozen=True)
class Roofline:
    """Prefill seconds of one model on one accelerator (module docstring): the same interface as
    :class:`kvcli.model.costcurve.CostCurve` (``predict``, ``seconds``, ``total``, ``draws``, ``totals``).

    Attributes:
        config: the model's shapes.
        accelerator: where it runs.
        element_bytes: bytes per weight and activation element (2 for bfloat16, 1 for fp8), and per KV element
            unless ``kv_element_bytes`` says otherwise.
        compute_dtype: the tensor-core dtype of its matrix multiplies ("bfloat16", "float16", "float8").
        mfu: the share of the dense peak a prefill reaches; ``mfu_range`` (low, high) gives its interval. None: the
            accelerator's published utilization at the compute dtype's precision (:attr:`published`) and its
            interval; ``mfu`` given without ``mfu_range``: the published interval's relative spread around it.
        kv_element_bytes: bytes per element of the KV cache read and written (1 for fp8 KV; None: ``element_bytes``).
        published: the accelerator's published utilization at that precision (None: none is published, and
            ``mfu`` and ``mfu_range`` were both given). Set at construction.

    Raises:
        BadInputError: a compute dtype the accelerator has no tensor-core figure for; no published utilization
            and no ``mfu``; ``mfu`` or its interval outside ``[MIN_MFU, 1]``.
    """

    config: ModelConfig
    accelerator: Accelerator
    element_bytes: int = 2
    compute_dtype: str = "bfloat16"
    mfu: float | None = None
    mfu_range: tuple[float, float] | None = None
    kv_element_bytes: int | None = None
    published: Utilization | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.accelerator.peak_flops(self.compute_dtype)  # the dtype has a tensor-core figure here
        if self.mfu is None or self.mfu_range is None:
            published = utilization(self.accelerator.name, precision_of(self.compute_dtype))
            object.__setattr__(self, "published", published)
            mfu = published.value if self.mfu is None else self.mfu
            scale = mfu / published.value
            object.__setattr__(self, "mfu", mfu)
            object.__setattr__(self, "mfu_range", (published.low * scale, min(1.0, published.high * scale)))
        assert self.mfu is not None and self.mfu_range is not None
        low, high = self.mfu_range
        if not (MIN_MFU <= low <= self.mfu <= high <= 1):
            raise BadInputError(f"--mfu must be in [{MIN_MFU}, 1] and within its interval, got {self.mfu} in "
                                f"[{low}, {high}]")

    # -- the cost interface (kvcli.model.costcurve.PrefillCost) -----------------------------------------------
    @property
    def points_data(self) -> tuple:
        """No calibration points: no range beyond which the figure is extrapolated."""
        return ()

    @property
    def residuals(self) -> tuple:
        """No timing noise of its own (its interval is the utilization's)."""
        return ()

    @property
    def longest_full_tokens(self) -> int:
        """0: nothing was timed (see :attr:`points_data`)."""
        return 0

    def predict(self, new_tokens, cached_tokens=0, mfu: float | None = None):
        """Seconds to prefill ``new_tokens`` after ``cached_tokens`` (numpy broadcasting; a float for scalars);
        0 where ``new_tokens`` is 0."""
        n = np.asarray(new_tokens, dtype=np.float64)
        c = np.asarray(cached_tokens, dtype=np.float64)
        g, acc, b = self.config, self.accelerator, self.element_bytes
        rate = acc.peak_flops(self.compute_dtype) * (self.share if mfu is None else mfu)
        bandwidth = acc.hbm_bytes_per_second
        layers = 0.0 * (n + c)
        for kind, moe, count in g.layer_classes():
            layers = layers + count * np.maximum(layer_flops(g, kind, moe, n, c) / rate,
                                                 layer_bytes(g, kind, moe, n, c, b, self.kv_element_bytes)
                                                 / bandwidth)
        head = np.maximum(lm_head_flops(g, n) / rate, head_bytes(g, b) / bandwidth)
        t = np.where(n > 0, layers + head, 0.0)
        return float(t) if t.ndim == 0 else t

    def seconds(self, new_tokens: int, cached_tokens: int) -> float:
        """:meth:`predict` for one pair of ints (tokens)."""
        return float(self.predict(new_tokens, cached_tokens))

    def total(self, terms, mfu: float | None = None) -> float:
        """Seconds summed over requests and terms (``[(sign, new_tokens, cached_tokens), ...]``, arrays
        ``[requests]``: :class:`kvcli.model.costcurve.PrefillCost`)."""
        return float(sum(sign * np.sum(self.predict(n, c, mfu)) for sign, n, c in terms))

    def draws(self, reps: int, seed: int = 0) -> np.ndarray:
        """``reps`` utilizations, uniform over :attr:`mfu_range`, seeded: the interval of what the figures give."""
        low, high = self.interval
        return np.random.default_rng([seed, 7]).uniform(low, high, reps)

    def totals(self, draws: np.ndarray, terms) -> np.ndarray:
        """:meth:`total` under each utilization of ``draws`` (``[reps]``)."""
        return np.array([self.total(terms, float(m)) for m in draws])

    def tokens_per_second(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Prefill throughput, new tokens per second."""
        return new_tokens / self.seconds(new_tokens, cached_tokens)

    @property
    def share(self) -> float:
        """:attr:`mfu` as set at construction (never None)."""
        assert self.mfu is not None
        return self.mfu

    @property
    def interval(self) -> tuple[float, float]:
        """:attr:`mfu_range` as set at construction (never None)."""
        assert self.mfu_range is not None
        return self.mfu_range

    @property
    def mfu_source(self) -> str:
        """Where the utilization comes from, in words: "h100-sxm bf16, published", "--mfu, h100-sxm bf16's spread"
        (a given one, the published interval's relative spread around it), or "given"."""
        if self.published is None:
            return "given"
        entry = f"{self.published.accelerator} {self.published.precision}"
        return f"{entry}, published" if self.share == self.published.value else f"--mfu, {entry}'s spread"

    def to_dict(self) -> dict:
        """JSON-ready: what the figure rests on; ``mfu_basis``: the published utilization, its rule and sources
        (:mod:`kvcli.model.utilization`), null where none is."""
        p = self.published
        basis = None if p is None else {"accelerator": p.accelerator, "precision": p.precision,
                                        "published": p.to_dict(), "rule": p.rule, "carried_from": p.carried_from,
                                        "sources": list(p.sources)}
        return {"kind": "roofline", "accelerator": self.accelerator.to_dict(), "compute_dtype": self.compute_dtype,
                "element_bytes": self.element_bytes,
                "kv_element_bytes": self.element_bytes if self.kv_element_bytes is None else self.kv_element_bytes,
                "mfu": self.share, "mfu_interval": list(self.interval), "mfu_source": self.mfu_source,
                "mfu_basis": basis}
