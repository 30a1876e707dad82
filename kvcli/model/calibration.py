"""Calibration that covers a trace: prefills timed across the trace's own prompt lengths, within a time budget.

A :class:`Calibration` is a pool of timed prefills of one model, grown trace by trace (a point timed for one trace
serves the next). :meth:`Calibration.cover` adds the points a trace needs, up to a target prompt length (the
replay asks for its 95th percentile), in this order, each kind until the budget would be exceeded:

1. base points, always: full prefills of 32, 128, 512 and 1,024 tokens, 256 new after 256 cached, 512 after 512,
   64 after 960;
2. full prefills ``(L, 0)`` for ``L`` = 2,048, 4,096, ... doubling up to the first ``L >= target``: the cost a hit
   of ``L`` tokens saves, timed directly;
3. *thin* points, 64 new tokens after ``L - 64`` cached, ``L`` = 4,096, 16,384, ... (x4) up to the target: the
   per-pair cost of attending to a long cached prefix, at the trace's own context lengths, for ``64 * L`` pairs
   instead of the ``L**2 / 2`` of a full prefill;
4. half hits ``(L/2, L/2)`` on the ladder of 2: the shape of a suffix prefill after a hit.

The longest full prefill timed (:attr:`CostCurve.longest_full_tokens`) is where extrapolation of what a hit saves
starts; the replay reports the share of its estimate beyond it.

:meth:`Calibration.time_points` times a given list of points instead, every one and without a budget, repeats
interleaved (``kvcli profile``'s grid, :mod:`kvcli.model.profile`); both time each prefill the same way.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvcli.errors import BadInputError
from kvcli.model.costcurve import CostCurve, PrefillSample, prefill_clock
from kvcli.prefixkv import StatefulKV
from kvcli.units import fmt_bytes

BASE_POINTS = ((32, 0), (128, 0), (512, 0), (1024, 0), (256, 256), (512, 512), (64, 960))
THIN_NEW_TOKENS = 64
MAX_PAST_BYTES = 1 << 30
_BLOCK = 4096  # tokens of random KV, tiled to any prefix length


@dataclass(frozen=True)
class Coverage:
    """What one :meth:`Calibration.cover` call did: ``target_tokens`` asked for, ``longest_tokens`` now calibrated
    (new + cached tokens of the longest point in the pool), points added, ``skipped`` points the budget (or the
    memory cap) left out, and the seconds it spent (wall)."""

    target_tokens: int
    longest_tokens: int
    points_added: int
    skipped: tuple[tuple[int, int], ...]
    seconds: float

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"target_tokens": self.target_tokens, "longest_tokens": self.longest_tokens,
                "points_added": self.points_added, "skipped_points": [list(p) for p in self.skipped],
                "seconds": self.seconds}


def ladder(target_tokens: int, start: int, step: int = 2) -> list[int]:
    """``start, step*start, ...`` up to the first value ``>= target_tokens`` (``[]`` when the target is at most
    ``start / step``, i.e. already covered below the ladder)."""
    out: list[int] = []
    length = start
    while step * target_tokens > start and (not out or out[-1] < target_tokens):
        out.append(length)
        length *= step
    return out


def plan_points(target_tokens: int) -> list[tuple[str, int, int]]:
    """Every (kind, new, cached) point :meth:`Calibration.cover` would time for ``target_tokens``, in order (module
    docstring): "base", "full", "thin", "half"."""
    out = [("base", n, c) for n, c in BASE_POINTS]
    out += [("full", n, 0) for n in ladder(target_tokens, 2048)]
    out += [("thin", THIN_NEW_TOKENS, n - THIN_NEW_TOKENS) for n in ladder(target_tokens, 4096, 4)]
    out += [("half", n // 2, n // 2) for n in ladder(target_tokens, 2048)]
    return out


class Calibration:
    """A pool of timed prefills on one model (:class:`PrefillSample`), grown to cover each trace.

    Args:
        model: a :class:`kvcli.model.llama.LocalModel` (``prefill``, ``synchronize``, ``config``, ``dtype``).
        seed: for the random token ids and KV.
        max_past_bytes: the largest random prefix KV a point may use (bytes).
    """

    def __init__(self, model, seed: int = 0, max_past_bytes: int = MAX_PAST_BYTES) -> None:
        self.model, self.max_past_bytes = model, max_past_bytes
        self.samples: list[PrefillSample] = []
        self.spent_seconds = 0.0
        self._rng = np.random.default_rng(seed)
        self._seed = seed
        self._block: torch.Tensor | None = None
        self._timed: set[tuple[int, int]] = set()
        self._curve: CostCurve | None = None

    @property
    def longest_tokens(self) -> int:
        """New + cached tokens of the longest point timed (0 before any)."""
        return max((s.new_tokens + s.cached_tokens for s in self.samples), default=0)

    def curve(self) -> CostCurve:
        """The cost curve fitted to every point in the pool. Raises BadInputError when the pool is empty."""
        if self._curve is None:
            self._curve = CostCurve.fit(self.samples)
        return self._curve

    def cover(self, target_tokens: int, budget_seconds: float) -> Coverage:
        """Time the points that cover prompts up to ``target_tokens`` (module docstring), spending at most about
        ``budget_seconds`` of model time (the prefill clock's seconds: CPU time on a CPU, so the same points are
        timed however loaded the machine is) on points not yet in the pool; the base points always run. A point is
        skipped when its predicted time x repeats would overrun what is left; larger points of the same kind are
        skipped with it. ``Coverage.seconds`` is the wall time the call took."""
        t0 = time.perf_counter()
        used = 0.0
        self._warm_up()
        added, skipped, blocked = 0, [], set()
        for kind, n, c in plan_points(max(int(target_tokens), 1)):
            if (n, c) in self._timed:
                continue
            predicted = self.curve().predict(n, c) if self.samples else 0.0
            repeats = 3 if predicted < 0.25 else 2
            if kind != "base" and (kind in blocked or predicted * repeats > budget_seconds - used
                                    or not self._past_fits(c)):
                blocked.add(kind)
                skipped.append((n, c))
                continue
            used += self._time_point(n, c, repeats)
            added += 1
        seconds = time.perf_counter() - t0
        self.spent_seconds += seconds
        return Coverage(int(target_tokens), self.longest_tokens, added, tuple(skipped), seconds)

    def time_points(self, points: Sequence[tuple[int, int]], repeats: int,
                    progress: Callable[[int, int, tuple[int, int]], None] | None = None) -> list[tuple[int, int, str]]:
        """Time every ``(new, cached)`` point ``repeats`` times, interleaved: round ``r`` times each point once, in
        order, so a slow spell of the device spreads over the points instead of hitting one; after the untimed
        warm-up, each timing between two device synchronizations, on :func:`prefill_clock`. The samples join the
        pool (:attr:`samples`), points already in it are timed again. No budget: every point that fits runs.

        Args:
            points: ``(new_tokens >= 1, cached_tokens >= 0)`` pairs, distinct.
            repeats: timings per point, >= 1.
            progress: called before each timing with (timings done, timings planned, the point about to run), and
                once at the end with (planned, planned, the last point).

        Returns:
            The points not timed, ``(new, cached, why)`` in the order given: a prefix KV larger than
            ``max_past_bytes``, or the device ran out of memory (CUDA; that point's timings are dropped, the others
            go on).

        Raises:
            BadInputError: ``repeats < 1``, a point with ``new < 1`` or ``cached < 0``, or a point given twice.
        """
        if repeats < 1 or len(set(points)) != len(points) or any(n < 1 or c < 0 for n, c in points):
            raise BadInputError("time_points needs distinct points (new >= 1, cached >= 0) and repeats >= 1")
        self._warm_up()
        skipped = [(n, c, self._too_large(c)) for n, c in points if not self._past_fits(c)]
        todo = [p for p in points if self._past_fits(p[1])]
        tokens = {p: self._rng.integers(0, self.model.config.vocab, p[0], dtype=np.uint32) for p in todo}
        timed: dict[tuple[int, int], list[float]] = {p: [] for p in todo}
        done, total = 0, len(todo) * repeats
        for _ in range(repeats):
            for point in [p for p in todo if p in timed]:
                if progress is not None:
                    progress(done, total, point)
                try:
                    timed[point].append(self._timed_prefill(tokens[point], self._past(point[1])))
                    done += 1
                    continue
                except torch.cuda.OutOfMemoryError:
                    pass
                torch.cuda.empty_cache()  # here, not in the except block: its traceback holds the failed tensors
                done, total = done - len(timed.pop(point)), total - repeats
                skipped.append((*point, f"out of memory on {self.model.device}"))
        if progress is not None and todo:
            progress(total, total, todo[-1])
        for (n, c), seconds in timed.items():
            self.samples.extend(PrefillSample(n, c, t) for t in seconds)
            self._timed.add((n, c))
        self._curve = None
        return sorted(skipped, key=lambda s: points.index(s[:2]))

    # -- timing ---------------------------------------------------------------------------------------------------
    def _warm_up(self) -> None:
        """One untimed prefill before the pool's first timing: the first call allocates and initializes."""
        if not self.samples:
            self.model.prefill(self._rng.integers(0, self.model.config.vocab, 32, dtype=np.uint32))
            self.model.synchronize()

    def _past_fits(self, cached: int) -> bool:
        return cached * self.model.config.kv_bytes_per_token(self.model.dtype) <= self.max_past_bytes

    def _too_large(self, cached: int) -> str:
        need = cached * self.model.config.kv_bytes_per_token(self.model.dtype)
        return f"prefix KV of {cached:,} tokens is {fmt_bytes(need)}, over the {fmt_bytes(self.max_past_bytes)} cap"

    def _past(self, cached: int) -> torch.Tensor | StatefulKV | None:
        """Random KV ``[layers, 2, kv_heads, cached, head_dim]``: one seeded random block of one layer, tiled to
        ``cached`` tokens and shared by every layer (a stride-0 view: ``1 / layers`` of the memory, so a point of
        65k cached tokens holds 67 MB rather than 537 MB for the ``cpu`` preset; attention after a long prefix is
        compute-bound, each layer reads the prefix as before); a hybrid model's with its linear layers' state after
        it, zero (the state a sequence starts from: its cost is the same)."""
        if cached == 0:
            return None
        config = self.model.config
        if self._block is None:
            g = torch.Generator().manual_seed(self._seed)
            shape = config.kv_shape(_BLOCK)[1:]
            self._block = torch.randn(shape, generator=g).to(self.model.dtype).to(self.model.device)
        reps = -(-cached // _BLOCK)
        layer = self._block.repeat(1, 1, reps, 1)[:, :, :cached].contiguous()
        past = layer.expand(config.kv_shape(cached))
        if not config.state_shape:
            return past
        return StatefulKV(past, {cached: torch.zeros(config.state_shape, dtype=self.model.dtype,
                                                     device=self.model.device)})

    def _timed_prefill(self, tokens: np.ndarray, past: torch.Tensor | StatefulKV | None) -> float:
        """The one timed prefill: model seconds of ``prefill(tokens, past)`` between two device synchronizations,
        on :func:`prefill_clock`."""
        model = self.model
        clock = prefill_clock(model)
        model.synchronize()
        start = clock()
        model.prefill(tokens, past, kv_for="new")  # the prefix read in place, not copied into the result
        model.synchronize()
        return clock() - start

    def _time_point(self, new: int, cached: int, repeats: int) -> float:
        """Time one point ``repeats`` times in a row; returns the model time spent (seconds)."""
        tokens = self._rng.integers(0, self.model.config.vocab, new, dtype=np.uint32)
        past = self._past(cached)
        for _ in range(repeats):
            self.samples.append(PrefillSample(new, cached, self._timed_prefill(tokens, past)))
        self._timed.add((new, cached))
        self._curve = None
        return sum(s.seconds for s in self.samples[-repeats:])
