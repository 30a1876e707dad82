"""A running serving engine's prefill cost surface, measured through its OpenAI-compatible API into a kvcli profile
(``kvcli profile --engine URL``): the same grid, file and reader as a local model's (:mod:`kvcli.model.profile`),
so ``kvcli replay --prefill-profile`` prices savings with an engine's own times on its own GPUs.

What is timed: each point ``(new n, cached c)`` of :func:`~kvcli.model.profile.profile_points` is a request of
``c + n`` random token ids whose first ``c`` (a prefix unique to the point) the engine has just been sent on their
own, so they are in its prefix cache; the time is the request's time to first token (TTFT: from sending it to the
first streamed chunk carrying a token, wall clock at the client, so HTTP and scheduling are in it). Every request
generates one token. The engine's usage must confirm each hit: ``prompt_tokens_details.cached_tokens`` equal to the
prefix floored to the engine's block size (where the engine says its block size; elsewhere: more than 0 and at
most the prefix), and 0 for a full prefill. A point whose count differs is not timed but listed as skipped with
what the engine reported; the timed points are stored at the new and cached tokens the engine reported. Repeats are
interleaved (each point once per round); random ids are drawn afresh for every run, so a second run against the
same engine hits nothing of the first.

Before timing, ``warmup`` untimed rounds, each a 512-token prefix and then that prefix plus 64 tokens, warm the
engine's paths and check what the measurement needs: usage in the stream, cached-token counts, a hit on the prefix.

The KV load/save rates of the file are kvcli's payload path timed where kvcli runs (:func:`measure_payload_path`,
on ``--device``): what the engine does with its KV is not visible through its API.
"""
from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvcli.errors import BadInputError, EngineFailure
from kvcli.model.costcurve import CostCurve, PrefillSample
from kvcli.model.engine_client import EngineClient, EngineInfo
from kvcli.model.presets import ModelConfig
from kvcli.model.profile import (
    FORMAT,
    KvCodec,
    KvTiming,
    Profile,
    Progress,
    SkippedPoint,
    TimedPoint,
    measure_kv,
    profile_points,
)
from kvcli.provenance import host_facts
from kvcli.redact import mask_argv
from kvcli.version import __version__

if TYPE_CHECKING:
    import torch

PROBE_PREFIX_TOKENS, PROBE_NEW_TOKENS = 512, 64
TIMED = "time to first token of a streamed completion (max_tokens 1), wall clock at the client"


@dataclass(frozen=True)
class EngineRun:
    """How to time an engine: the ``vocab`` the random token ids are drawn below (the served model's embedding
    rows), ``max_tokens`` (the longest point, new + cached tokens; None: the shapes' context, capped at what the
    engine serves), ``repeats`` per point and ``warmup`` rounds (>= 1: they also check the engine).

    Raises:
        BadInputError: a count below 1.
    """

    vocab: int
    max_tokens: int | None = None
    repeats: int = 3
    warmup: int = 2

    def __post_init__(self) -> None:
        for flag, value in (("--repeats", self.repeats), ("--warmup", self.warmup), ("vocab", self.vocab)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadInputError(f"{flag} must be a whole number >= 1, got {value}")


def engine_max_tokens(info: EngineInfo, shapes: ModelConfig, max_tokens: int | None) -> int:
    """The longest point to time, new + cached tokens: ``max_tokens``, or the shapes' context, at most one less
    than the engine's ``max_model_len`` (the generated token needs a place).

    Raises:
        BadInputError: ``max_tokens`` beyond what the engine serves, or below the smallest grid (512).
    """
    from kvcli.model.profile import check_max_tokens

    room = info.max_model_len - 1 if info.max_model_len else None
    if max_tokens is not None and room is not None and max_tokens > room:
        raise BadInputError(f"--max-tokens {max_tokens:,}: the engine serves {info.max_model_len:,} tokens "
                            f"(max_model_len), prompts of at most {room:,} with the one generated")
    longest = max_tokens if max_tokens is not None else min(shapes.context, room or shapes.context)
    check_max_tokens(longest)
    return longest


def measure_engine_profile(client: EngineClient, info: EngineInfo, run: EngineRun, *, model: str, model_id: str,
                           dtype: str, shapes: ModelConfig, kv: Callable[[], PayloadTimings],
                           progress: Progress | None = None) -> Profile:
    """Time ``info.served_model`` on the engine behind ``client`` (module docstring) into a :class:`Profile`.

    Args:
        client, info: the engine and what it said (:meth:`EngineClient.info`).
        run: the grid's limit, repeats, warm-up rounds and vocabulary (:class:`EngineRun`).
        model, model_id, dtype, shapes: the ``--model`` the engine serves (a preset's name or a config folder),
            its id, dtype (torch's name) and shapes: what a replay matches the profile against.
        kv: times the KV payload path where kvcli runs, called once the engine is timed
            (:func:`measure_payload_path`).
        progress: :data:`~kvcli.model.profile.Progress`, phase ``"prefill"``, before each timed request.

    Returns:
        The profile; its ``engine`` says what the engine is and how it was timed, its points are TTFTs.

    Raises:
        EngineFailure: the engine failed a request, streams no usage or cached-token counts, never hits a prefix
            it was just sent (prefix caching off), or no point could be confirmed. BadInputError: ``max_tokens``
            (``run``) outside what the engine serves or below 512.
    """
    longest = engine_max_tokens(info, shapes, run.max_tokens)
    plan = profile_points(longest)
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    start = time.perf_counter()
    timer = _Timer(client, info, np.random.default_rng(), run.vocab)
    for _ in range(run.warmup):
        timer.probe()
    points, skipped = _time_plan(timer, plan, run.repeats, progress or (lambda *_: None))
    curve = CostCurve.fit([PrefillSample(p.new_tokens, p.cached_tokens, s) for p in points for s in p.seconds])
    payload = kv()
    return Profile(
        format=FORMAT, kvcli_version=__version__, created=created, command_line=tuple(mask_argv(sys.argv)),
        device=payload.device, host=host_facts(), model_id=model_id, model=model, dtype=dtype, shapes=shapes,
        clock="perf_counter", max_tokens=longest, repeats=run.repeats,
        max_past_bytes=max(p.cached_tokens for p in points) * shapes.kv_bytes_per_token(dtype), points=points,
        skipped=skipped, fit=curve.to_dict(), kv_timings=payload.timings,
        measure_seconds=time.perf_counter() - start, kv_dtype=payload.kv_dtype,
        engine=info.to_dict() | {"timed": TIMED, "warmup_rounds": run.warmup})


def time_engine_points(client: EngineClient, info: EngineInfo, points: list[tuple[int, int]], run: EngineRun,
                       progress: Progress | None = None) -> tuple[tuple[TimedPoint, ...], tuple[SkippedPoint, ...]]:
    """Time ``(new, cached)`` ``points`` on the engine as :func:`measure_engine_profile` times its grid (module
    docstring: ``run.warmup`` warm-up rounds, then ``run.repeats`` interleaved rounds, each hit confirmed), kind
    ``"point"``: for checking a profile's predictions at points it did not time. ``run.max_tokens`` is not used.

    Returns:
        The confirmed points (at the engine's counts) and the skipped ones with why.

    Raises:
        EngineFailure: as :func:`measure_engine_profile`.
    """
    timer = _Timer(client, info, np.random.default_rng(), run.vocab)
    for _ in range(run.warmup):
        timer.probe()
    return _time_plan(timer, [("point", n, c) for n, c in points], run.repeats, progress or (lambda *_: None))


@dataclass(frozen=True)
class PayloadTimings:
    """kvcli's KV payload path timed on one device: its facts (:func:`~kvcli.model.profile.device_facts`), the
    timings per chunk size, and the payloads' dtype (None: the model's)."""

    device: dict
    timings: tuple[KvTiming, ...]
    kv_dtype: str | None


def measure_payload_path(shapes: ModelConfig, dtype: str, device: str, codec: KvCodec, repeats: int,
                         progress: Progress | None = None) -> PayloadTimings:
    """kvcli's KV payload path (:func:`~kvcli.model.profile.measure_kv`) for KV of ``shapes`` in ``dtype`` on
    ``device`` (``auto``, ``cpu``, ``cuda``) where kvcli runs, payloads of ``codec.kv_dtype``.

    Raises:
        BadInputError: an unknown device. ModelFailure: CUDA asked for and absent; a value failed its checksum.
    """
    from kvcli.model.llama import resolve_device
    from kvcli.model.profile import device_facts
    from kvcli.units import torch_dtype

    where = _PayloadDevice(shapes, torch_dtype(dtype), resolve_device(device))
    return PayloadTimings(device_facts(where.device), measure_kv(where, codec, repeats, progress), codec.kv_dtype)


@dataclass(frozen=True)
class _PayloadDevice:
    """What :func:`~kvcli.model.profile.measure_kv` reads of a model: its shapes, dtype and device."""

    config: ModelConfig
    dtype: torch.dtype
    device: torch.device

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)


class _Timer:
    """Requests to the engine: random token ids, a prefix warmed then hit, the engine's counts checked."""

    def __init__(self, client: EngineClient, info: EngineInfo, rng: np.random.Generator, vocab: int) -> None:
        self.client, self.info, self.rng, self.vocab = client, info, rng, vocab

    def ids(self, count: int) -> list[int]:
        """``count`` random token ids below the vocabulary."""
        return self.rng.integers(0, self.vocab, count).tolist()

    def send(self, token_ids: list[int]) -> tuple[float, int]:
        """One completion of ``token_ids``: its TTFT (seconds) and the cached tokens the engine reported.

        Raises:
            EngineFailure: as :meth:`EngineClient.complete`; the usage has no cached-token count; the engine
                counted another number of prompt tokens than sent.
        """
        done = self.client.complete(self.info.served_model, token_ids)
        if done.cached_tokens is None:
            raise EngineFailure(f"the engine at {self.info.url} reports no prompt_tokens_details.cached_tokens in "
                                "its usage, which confirms each cache hit (vLLM: --enable-prompt-tokens-details)")
        if done.prompt_tokens != len(token_ids):
            raise EngineFailure(f"the engine at {self.info.url} counted {done.prompt_tokens:,} prompt tokens for "
                                f"the {len(token_ids):,} token ids sent")
        return done.ttft_seconds, done.cached_tokens

    def hit(self, prefix: list[int], new: int) -> tuple[float, int]:
        """Send ``prefix`` (so the engine caches it), then ``prefix`` + ``new`` fresh ids: the second's TTFT and
        cached tokens. A ``prefix`` of no tokens sends one request."""
        if prefix:
            self.send(prefix)
        return self.send(prefix + self.ids(new))

    def probe(self) -> None:
        """One warm-up round (module docstring). Raises EngineFailure when the engine does not hit the prefix."""
        _, cached = self.hit(self.ids(PROBE_PREFIX_TOKENS), PROBE_NEW_TOKENS)
        if cached == 0:
            off = (" (its /metrics says enable_prefix_caching False)" if self.info.prefix_caching is False else
                   f" (or it caches blocks of more than {PROBE_PREFIX_TOKENS} tokens)" if not self.info.block_size
                   else "")
            raise EngineFailure(f"the engine at {self.info.url} reported 0 cached tokens for a {PROBE_PREFIX_TOKENS}"
                                f"-token prefix it had just been sent: prefix caching is off{off}; start it with "
                                "prefix caching (vLLM: --enable-prefix-caching)")

    def expected(self, cached: int) -> int | None:
        """The cached tokens the engine should report for a prefix of ``cached`` tokens: floored to its block size
        (None: the block size is unknown)."""
        block = self.info.block_size
        return cached // block * block if block else None

    def confirms(self, prefix: int, reported: int) -> bool:
        """Whether ``reported`` cached tokens confirm a hit on a prefix of ``prefix`` tokens (module docstring)."""
        want = self.expected(prefix)
        if want is not None:
            return reported == want
        return reported == 0 if prefix == 0 else 0 < reported <= prefix


def _time_plan(timer: _Timer, plan: list[tuple[str, int, int]], repeats: int,
               progress: Progress) -> tuple[tuple[TimedPoint, ...], tuple[SkippedPoint, ...]]:
    """Time ``plan``'s points ``repeats`` times, interleaved: the confirmed points at the engine's counts, and the
    points skipped with why. Raises EngineFailure when none is confirmed."""
    prefixes = {(n, c): timer.ids(c) for _, n, c in plan}
    seconds: dict[tuple[int, int], list[float]] = {(n, c): [] for _, n, c in plan}
    counted: dict[tuple[int, int], int] = {}  # the cached tokens the engine reported at the first repeat
    why: dict[tuple[int, int], str] = {}
    done, total = 0, len(plan) * repeats
    for _ in range(repeats):
        for _, n, c in plan:
            if (n, c) in why:
                continue
            progress("prefill", done, total, f"{n:,} new" + (f" after {c:,} cached" if c else ""))
            ttft, cached = timer.hit(prefixes[n, c], n)
            first = counted.setdefault((n, c), cached)
            if not timer.confirms(c, cached) or cached != first:
                why[n, c] = _refusal(timer, c, sorted({first, cached}))
                total -= repeats
                done -= len(seconds[n, c])
                continue
            seconds[n, c].append(ttft)
            done += 1
    progress("prefill", total, total, "done")
    points = tuple(TimedPoint(k, n + c - counted[n, c], counted[n, c], tuple(seconds[n, c]))
                   for k, n, c in plan if (n, c) not in why)
    skipped = tuple(SkippedPoint(k, n, c, why[n, c]) for k, n, c in plan if (n, c) in why)
    if not points:
        raise EngineFailure(f"no point could be confirmed on the engine at {timer.info.url}: {skipped[0].reason}")
    return points, skipped


def _refusal(timer: _Timer, prefix: int, reported: list[int]) -> str:
    """Why a point is not timed: what the engine reported against what a confirmed hit is."""
    counts = " and ".join(f"{r:,}" for r in reported)
    want = timer.expected(prefix)
    if prefix == 0:
        expect = "0 (a prompt never sent before)"
    elif want is not None:
        expect = f"{want:,} (the prefix floored to its {timer.info.block_size}-token blocks)"
    else:
        expect = f"more than 0 and at most {prefix:,}"
    return f"the engine reported {counts} cached tokens of a {prefix:,}-token prefix, expected {expect}"

