"""How many torch threads a process's prefills use: given, or measured on this machine in this run.

torch starts one intra-op thread per core. On a small, shared VM that is often the slower choice: on the project's
2-vCPU machines a 2,200-token prefill took 3.16 s with 2 threads and 0.81 s with 1, and deserializing its KV
0.79 s vs 0.02 s (issue 11; OpenMP threads waiting for a core another process holds). So kvcli chooses:
``threads`` given (``--threads N``) is used as is; otherwise (``auto``) each candidate (1, and the cores this
process may use, divided among ``jobs`` parallel replays) times the same prefill (``tokens`` new tokens, fastest of
``repeats``, candidates interleaved) and the fastest wins. The timings go into the report's context.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from kvcli.errors import BadInputError


def cores() -> int:
    """CPU cores this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class ThreadChoice:
    """The torch thread count used, how it was chosen (``"given"``, ``"measured"``, ``"one candidate"``), and the
    measured prefill seconds per candidate (fastest of the repeats)."""

    threads: int
    how: str
    seconds: dict[int, float] = field(default_factory=dict)
    tokens: int = 0

    def to_dict(self) -> dict:
        """JSON-ready (``prefill_seconds`` keyed by thread count)."""
        return {"threads": self.threads, "how": self.how, "prefill_tokens": self.tokens,
                "prefill_seconds": {str(k): v for k, v in self.seconds.items()}}

    def describe(self) -> str:
        """One line for the report's context."""
        if not self.seconds:
            return f"torch threads {self.threads} ({self.how})"
        timed = ", ".join(f"{s:.3f} s with {t}" for t, s in sorted(self.seconds.items()))
        return f"torch threads {self.threads} ({self.how}: a {self.tokens}-token prefill took {timed})"


def choose_threads(model, threads: int | None = None, jobs: int = 1, tokens: int = 256,
                   repeats: int = 3) -> ThreadChoice:
    """Set and return the torch thread count for ``model``'s prefills in this process (see the module docstring).

    Args:
        model: a :class:`kvcli.model.LocalModel` (``prefill``, ``synchronize``, ``config.vocab``).
        threads: use this many (>= 1); None measures.
        jobs: parallel replays sharing the cores (each gets ``cores() // jobs``).

    Raises:
        BadInputError: ``threads`` < 1.
    """
    import torch

    if threads is not None:
        if threads < 1:
            raise BadInputError(f"--threads must be >= 1 or auto, got {threads}")
        torch.set_num_threads(threads)
        return ThreadChoice(threads, "given")
    candidates = sorted({1, max(1, cores() // max(1, jobs))})
    if len(candidates) == 1:
        torch.set_num_threads(candidates[0])
        return ThreadChoice(candidates[0], "one candidate: one core per job")
    ids = np.random.default_rng(0).integers(0, model.config.vocab, tokens, dtype=np.uint32)
    best = {t: float("inf") for t in candidates}
    for _ in range(repeats + 1):  # the first round warms up, untimed
        for t in candidates:
            torch.set_num_threads(t)
            start = time.perf_counter()
            model.prefill(ids)
            model.synchronize()
            if _ > 0:
                best[t] = min(best[t], time.perf_counter() - start)
    chosen = min(candidates, key=lambda t: (best[t], t))
    torch.set_num_threads(chosen)
    return ThreadChoice(chosen, "measured", best, tokens)
