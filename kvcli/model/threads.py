"""torch's intra-op thread count for a block of work, restored after it.

One thread gives repeatable prefill timings on a shared machine (two threads ran 2-4x slower than one on a loaded
2-vCPU machine) and is the fastest for small memory-bound copies, where waking other threads costs more than the
copy itself.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` (a positive count) for the block, then restored.

    None leaves them unchanged without importing torch, so work that runs no model never loads it.
    """
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
