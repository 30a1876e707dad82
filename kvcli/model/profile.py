"""Profiles: a model's prefill cost surface and KV load/save rates, measured on one device, in a portable JSON file.

A replay on one machine can price what a cache saves with prefill measured on another (a GPU it will be served
on): :func:`measure_profile` times the surface ``t(new tokens, cached tokens)`` there, :meth:`Profile.save` writes
it, :meth:`Profile.load` reads it back anywhere and :meth:`Profile.curve` refits the same
:class:`~kvcli.model.costcurve.CostCurve` from the stored points.

What is timed (:func:`profile_points`): :mod:`kvcli.model.calibration`'s kinds of points, up to ``max_tokens`` new +
cached tokens: the base points, full prefills on the doubling ladder 2,048, 4,096, ..., *thin* points (64 new
after ``L - 64`` cached, ``L`` = 4,096, 16,384, ...) and half hits (``L/2`` after ``L/2``); each point ``repeats``
times, interleaved (:meth:`Calibration.time_points <kvcli.model.calibration.Calibration.time_points>`). A point
whose random prefix KV would exceed ``max_past_bytes``, or that runs the device out of memory, is skipped and
listed. Then the KV payload path, at chunks of 64, 256 and 1,024 tokens: *save* copies a chunk's KV from the device
into its serialized value and checksums it (what the store writes), *load* decodes a value, checks it against its
checksum and copies the tensor to the device (what a hit reads).

A running serving engine's surface is measured through its API into the same file
(:mod:`kvcli.model.engine_profile`, ``kvcli profile --engine``): its points are times to first token, and its
``engine`` object says what the engine is.

The file (:meth:`Profile.to_dict`) is kvcli's JSON envelope (``schema_version``, ``command``) around
``"format": "kvcli-profile/1"``; a reader of format 1 ignores fields it does not know, and refuses a newer version.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvcli.errors import BadInputError, ModelFailure
from kvcli.model.costcurve import CostCurve, PrefillSample, determines_curve, prefill_clock
from kvcli.model.presets import ModelConfig, check_dtype, dtype_short
from kvcli.outfile import write_output
from kvcli.provenance import cpu_model, host_facts, ram_bytes
from kvcli.redact import mask_argv
from kvcli.units import dtype_key, json_document
from kvcli.version import __version__

if TYPE_CHECKING:
    import torch

FORMAT_NAME, FORMAT_VERSION = "kvcli-profile", 1
FORMAT = f"{FORMAT_NAME}/{FORMAT_VERSION}"
MIN_MAX_TOKENS = 512  # the smallest grid, (32, 0) (128, 0) (512, 0) (256, 256), that determines the 4 coefficients
MAX_MAX_TOKENS = 1 << 22  # 4,194,304 tokens: above the longest context of the presets and of usual checkpoints
MAX_REPEATS = 100  # timings of each point: the fastest of a few is the estimate (CostCurve.fit), 100 is plenty
RATE_CHUNK_TOKENS = (64, 256, 1024)
#: KV payload dtypes a profile may record besides the model's (torch's names; ``kvcli.store.serde.KV_DTYPES``'
#: values: the model package imports nothing of the store).
KV_PAYLOAD_DTYPES = ("float8_e4m3fn",)
#: The shapes that set a prefill's cost: two models alike in these (and in dtype) share a profile.
COST_SHAPES = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "layer_types", "sliding_window",
               "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "experts",
               "experts_per_token", "moe_ffn", "shared_ffn", "shared_gate", "dense_layers", "state_elements",
               "linear_params", "attn_output_gate", "gated_mlp", "mixer_mlp", "linear_mixer", "linear_heads",
               "linear_head_dim", "linear_key_heads", "linear_key_dim", "linear_conv_kernel", "linear_chunk",
               "moe_latent")

#: ``progress(phase, done, total, what)``: phase "prefill" (timings of points) or "kv" (timings of chunks).
Progress = Callable[[str, int, int, str], None]


@dataclass(frozen=True)
class KvCodec:
    """How a chunk's KV becomes a stored value and back: the store's own functions, handed in (the model package
    imports nothing of the store; ``kvcli.cli.profile.store_codec`` builds this one).

    Attributes:
        encode: ``encode(kv) -> (value, checksum)``: ``kv`` ``[layers, 2, kv_heads, tokens, head_dim]`` on any
            device, copied into ``value`` (the bytes the store writes); ``checksum`` of its tensor bytes.
        decode: ``decode(value, checksum, shape, dtype) -> tensor or None``: the tensor of ``value`` (host memory)
            when it decodes to ``shape`` and matches ``checksum``, in ``dtype`` (the model's: a payload of
            ``kv_dtype`` dequantized to it), else None.
        kv_dtype: the payloads' dtype when it is not the model's (``--kv-dtype fp8``: ``"float8_e4m3fn"``, with
            per-layer K and V scales, :mod:`kvcli.store.serde`); None: the model's, bit-exact.
    """

    encode: Callable[[Any], tuple[Any, bytes]]
    decode: Callable[[Any, bytes, tuple[int, ...], Any], Any]
    kv_dtype: str | None = None


@dataclass(frozen=True)
class TimedPoint:
    """One point of the surface: ``kind`` ("base", "full", "thin", "half"), ``new_tokens`` prefilled after
    ``cached_tokens``, and the ``seconds`` of each repeat, in the order timed."""

    kind: str
    new_tokens: int
    cached_tokens: int
    seconds: tuple[float, ...]

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"kind": self.kind, "new_tokens": self.new_tokens, "cached_tokens": self.cached_tokens,
                "seconds": list(self.seconds)}


@dataclass(frozen=True)
class SkippedPoint:
    """A planned point not timed: ``kind``, ``new_tokens`` after ``cached_tokens``, and the ``reason``."""

    kind: str
    new_tokens: int
    cached_tokens: int
    reason: str

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"kind": self.kind, "new_tokens": self.new_tokens, "cached_tokens": self.cached_tokens,
                "reason": self.reason}


@dataclass(frozen=True)
class KvTiming:
    """The KV payload path at one chunk size: ``chunk_tokens`` of KV, ``kv_bytes`` of tensor, ``value_bytes`` of
    serialized value (header + tensor), and the seconds of each repeat of load and of save."""

    chunk_tokens: int
    kv_bytes: int
    value_bytes: int
    load_seconds: tuple[float, ...]
    save_seconds: tuple[float, ...]

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"chunk_tokens": self.chunk_tokens, "kv_bytes": self.kv_bytes, "value_bytes": self.value_bytes,
                "load_seconds": list(self.load_seconds), "save_seconds": list(self.save_seconds)}


@dataclass(frozen=True)
class Profile:
    """A model's prefill cost surface and KV rates measured on one device (module docstring). Build it with
    :func:`measure_profile` or :meth:`load`.

    Attributes:
        format: ``"kvcli-profile/1"``. kvcli_version: of the kvcli that measured it. created: UTC, ISO 8601.
        command_line: ``sys.argv`` of the measuring process.
        device: facts of the device (:func:`device_facts`). host: facts of the machine (:func:`host_facts`).
        model_id: the model's id (``kvcli/llama-3-8b@seed0:bf16``). model: the ``--model`` it was measured with (a
            preset's name or a checkpoint folder). dtype: torch's dtype name (``"bfloat16"``). shapes: its shapes.
        clock: the prefill clock's name (:func:`~kvcli.model.costcurve.prefill_clock`): ``"thread_time"`` (the
            thread's CPU time: a CPU with one torch thread) or ``"perf_counter"`` (wall time: a GPU, or threads).
        max_tokens: the longest point planned, new + cached tokens. repeats: timings per point and per chunk.
        max_past_bytes: the largest random prefix KV a point could use, bytes.
        points: the timed points, in plan order. skipped: the planned points not timed, with why.
        fit: ``CostCurve.to_dict()`` of the fit at measurement time (:meth:`curve` refits the same).
        kv_timings: the load/save timings per chunk size (:data:`RATE_CHUNK_TOKENS`).
        measure_seconds: wall time the measurement took.
        kv_dtype: the KV payloads' dtype when it was not the model's (``--kv-dtype fp8``: ``"float8_e4m3fn"``);
            None: the model's (``auto``; a profile written before the field).
        engine: for a profile measured through a serving engine's API (:mod:`kvcli.model.engine_profile`): what
            the engine said (``url``, ``name``, ``version``, ``served_model``, ``max_model_len``, ``block_size``,
            ``prefix_caching``, ``kv_cache_dtype``) and how it was timed (``timed``, ``warmup_rounds``); the points
            are then times to first token, ``device`` is where the KV rates were timed. None: a local model's.
    """

    format: str
    kvcli_version: str
    created: str
    command_line: tuple[str, ...]
    device: dict
    host: dict
    model_id: str
    model: str
    dtype: str
    shapes: ModelConfig
    clock: str
    max_tokens: int
    repeats: int
    max_past_bytes: int
    points: tuple[TimedPoint, ...]
    skipped: tuple[SkippedPoint, ...]
    fit: dict
    kv_timings: tuple[KvTiming, ...]
    measure_seconds: float
    kv_dtype: str | None = None
    engine: dict | None = None

    def samples(self) -> list[PrefillSample]:
        """Every timing as a :class:`PrefillSample`, point by point in plan order."""
        return [PrefillSample(p.new_tokens, p.cached_tokens, s) for p in self.points for s in p.seconds]

    def curve(self) -> CostCurve:
        """The :class:`CostCurve` fitted to the stored points (``CostCurve.fit``: deterministic, so the same
        coefficients and points as at measurement time). Refitted at each call (milliseconds)."""
        return CostCurve.fit(self.samples())

    @property
    def longest_full_tokens(self) -> int:
        """The longest full prefill (no cached tokens) timed, tokens: beyond it a hit's saving is extrapolated."""
        return max((p.new_tokens for p in self.points if p.cached_tokens == 0), default=0)

    @property
    def load_bytes_per_second(self) -> float | None:
        """KV load rate, bytes of payload value per second: ``value_bytes`` of the largest chunk over its fastest
        repeat of decode + checksum + copy to the device (None when that took no measurable time)."""
        return _rate(self.kv_timings, "load_seconds")

    @property
    def save_bytes_per_second(self) -> float | None:
        """KV save rate, bytes of payload value per second: ``value_bytes`` of the largest chunk over its fastest
        repeat of copy from the device + serialize + checksum (None when that took no measurable time)."""
        return _rate(self.kv_timings, "save_seconds")

    @property
    def kv_bytes_per_token(self) -> int:
        """KV tensor bytes per token of the payloads timed: :meth:`~kvcli.model.presets.ModelConfig.
        kv_bytes_per_token` in :attr:`kv_dtype` (1 byte per element for fp8), else in :attr:`dtype` (fp8's
        per-layer scales, a few bytes per chunk, are not per token)."""
        return self.shapes.kv_bytes_per_token(self.kv_dtype or self.dtype)

    def matches(self, config: ModelConfig, dtype, kv_dtype: str | None = None) -> str:
        """Whether this profile prices prefills of a model of ``config``'s shapes in ``dtype`` (torch's or a
        name), its KV payloads in ``kv_dtype`` (torch's name; None: the model's): ``""`` (falsy) when the shapes
        that set the cost (:data:`COST_SHAPES`), the dtype and the KV payloads' dtype (its load/save rates are
        those of that payload) are the profile's; else a one-line reason naming what differs and the options
        the profile was measured with.

        Raises:
            BadInputError: ``dtype`` is not a dtype kvcli knows.
        """
        want = check_dtype(dtype_key(dtype))
        diffs = [f"{f} {getattr(self.shapes, f)} (here {getattr(config, f)})" for f in COST_SHAPES
                 if getattr(self.shapes, f) != getattr(config, f)]
        if want != self.dtype:
            diffs.append(f"dtype {dtype_short(self.dtype)} (here {dtype_short(want)})")
        if kv_dtype != self.kv_dtype:
            diffs.append(f"--kv-dtype {_kv_name(self.kv_dtype)} (here {_kv_name(kv_dtype)})")
        if not diffs:
            return ""
        kv = f" --kv-dtype {_kv_name(self.kv_dtype)}" if self.kv_dtype else ""
        return (f"the profile was measured with --model {self.model} --dtype {dtype_short(self.dtype)}{kv} "
                f"({self.model_id}), which differs in {', '.join(diffs)}")

    def to_dict(self) -> dict:
        """The profile document, JSON-ready (module docstring; docs/model.md, "Profiles")."""
        return {
            "format": self.format, "kvcli_version": self.kvcli_version, "created": self.created,
            "command_line": list(self.command_line), "device": dict(self.device), "host": dict(self.host),
            "model": {"model_id": self.model_id, "model": self.model, "dtype": self.dtype,
                      "shapes": dataclasses.asdict(self.shapes)},
            "clock": self.clock, "max_tokens": self.max_tokens, "repeats": self.repeats,
            "max_past_bytes": self.max_past_bytes, "measure_seconds": self.measure_seconds,
            "points": [p.to_dict() for p in self.points],
            "skipped_points": [s.to_dict() for s in self.skipped],
            "fit": self.fit,
            "kv_rates": {"kv_dtype": self.kv_dtype, "kv_bytes_per_token": self.kv_bytes_per_token,
                         "load_bytes_per_second": self.load_bytes_per_second,
                         "save_bytes_per_second": self.save_bytes_per_second,
                         "timings": [t.to_dict() for t in self.kv_timings]},
            "engine": self.engine,
        }

    def to_json(self) -> str:
        """The file's text: :func:`kvcli.units.json_document` (``schema_version``, ``command: "profile"``) around
        :meth:`to_dict`, indent 1."""
        return json_document("profile", self.to_dict(), indent=1)

    def save(self, path: str | Path) -> str:
        """Write :meth:`to_json` to ``path`` by :func:`kvcli.outfile.write_output` (a regular file through a
        temporary file beside it, so a reader never sees half a profile; a FIFO or a device in place) and return
        the text written.

        Raises:
            BadInputError: ``path`` cannot be written (naming ``--out`` and the path; the old file kept).
        """
        text = self.to_json()
        with write_output(path, "--out") as f:
            f.write(text + "\n")
        return text

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """Read a profile written by :meth:`save` (or ``kvcli profile --json``).

        Raises:
            BadInputError: one line naming ``path``: it cannot be read, is not JSON (a truncated file), is not a
                kvcli profile or is of a newer format version, a field is missing, of the wrong type or out of
                range, or the timed points do not determine the cost curve (four copies of one point).
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInputError(f"cannot read the profile: {getattr(exc, 'strerror', None) or exc}",
                                path=str(path)) from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInputError(f"not a kvcli profile: invalid JSON at line {exc.lineno} column {exc.colno} "
                                f"({exc.msg})", path=str(path)) from None
        try:
            return _from_dict(doc)
        except _Invalid as exc:
            raise BadInputError(str(exc), path=str(path)) from None


def check_max_tokens(max_tokens: int, context: int | None = None) -> None:
    """Raise BadInputError (naming ``--max-tokens``) unless ``max_tokens`` is an integer from
    :data:`MIN_MAX_TOKENS` (the smallest grid that fits the curve's four coefficients) to the model's ``context``
    (its longest prompt, tokens; None: not checked) and :data:`MAX_MAX_TOKENS`."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < MIN_MAX_TOKENS:
        raise BadInputError(f"--max-tokens must be at least {MIN_MAX_TOKENS} (the smallest grid that determines the "
                            f"cost curve), got {max_tokens}")
    if max_tokens > MAX_MAX_TOKENS:
        raise BadInputError(f"--max-tokens must be at most {MAX_MAX_TOKENS:,} tokens (a prefill longer than any "
                            f"model's context), got {max_tokens:,}")
    if context is not None and max_tokens > context:
        raise BadInputError(f"--max-tokens must be at most the model's context, {context:,} tokens, got "
                            f"{max_tokens:,}")


def check_repeats(repeats: int) -> None:
    """Raise BadInputError (naming ``--repeats``) unless ``repeats`` is an integer in ``[1, MAX_REPEATS]``."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        raise BadInputError(f"--repeats must be an integer in [1, {MAX_REPEATS}], got {repeats}")


def profile_points(max_tokens: int) -> list[tuple[str, int, int]]:
    """The ``(kind, new, cached)`` points a profile up to ``max_tokens`` times, in order: those of
    :func:`kvcli.model.calibration.plan_points` whose new + cached tokens are at most ``max_tokens``.

    Raises:
        BadInputError: ``max_tokens`` < :data:`MIN_MAX_TOKENS`.
    """
    from kvcli.model.calibration import plan_points

    check_max_tokens(max_tokens)
    return [(kind, n, c) for kind, n, c in plan_points(max_tokens) if n + c <= max_tokens]


def measure_profile(model, max_tokens: int | None = None, repeats: int = 3, progress: Progress | None = None,
                    max_past_bytes: int | None = None, *, codec: KvCodec) -> Profile:
    """Measure ``model``'s prefill cost surface and KV load/save rates on its device (module docstring).

    Args:
        model: a loaded model (:func:`kvcli.model.load.load_model`: ``prefill``, ``synchronize``, ``config``,
            ``dtype``, ``device``, ``model_id``).
        max_tokens: the longest point, new + cached tokens (None: the model's context, ``config.context``).
        repeats: timings per point and per chunk size, interleaved (the fit takes each point's fastest).
        progress: :data:`Progress`, called before each timing and at the end of each phase.
        max_past_bytes: the largest random prefix KV a point may use, bytes (None: a quarter of the device's free
            memory, :func:`kvcli.model.llama.available_bytes`); points beyond it are skipped and listed.
        codec: the store's serialization (:class:`KvCodec`), timed for the load/save rates.

    Returns:
        The :class:`Profile`; the KV rates are bytes of payload value over the fastest repeat of the largest chunk
        (1,024 tokens), as :attr:`Profile.load_bytes_per_second` says.

    Raises:
        BadInputError: ``max_tokens`` < 512, ``repeats`` < 1. ModelFailure: no point could be timed (all
            skipped), or a value failed its checksum on load.
    """
    from kvcli.model.llama import available_bytes

    max_tokens = model.config.context if max_tokens is None else max_tokens
    plan = profile_points(max_tokens)
    if repeats < 1:
        raise BadInputError(f"--repeats must be >= 1, got {repeats}")
    if max_past_bytes is None:
        max_past_bytes = available_bytes(model.device) // 4
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    device, host = device_facts(model.device), host_facts()
    start = time.perf_counter()
    points, skipped, curve = _time_plan(model, plan, repeats, int(max_past_bytes), progress)
    checkpoint = getattr(model, "checkpoint", None)
    return Profile(
        format=FORMAT, kvcli_version=__version__, created=created, command_line=tuple(mask_argv(sys.argv)),
        device=device, host=host, model_id=model.model_id,
        model=checkpoint.path if checkpoint is not None else model.config.name,
        dtype=dtype_key(model.dtype), shapes=model.config, clock=prefill_clock(model).__name__,
        max_tokens=max_tokens, repeats=repeats, max_past_bytes=int(max_past_bytes), points=points,
        skipped=skipped, fit=curve.to_dict(), kv_timings=measure_kv(model, codec, repeats, progress),
        measure_seconds=time.perf_counter() - start, kv_dtype=codec.kv_dtype)


def _time_plan(model, plan: list[tuple[str, int, int]], repeats: int, max_past_bytes: int,
               progress: Progress | None) -> tuple[tuple[TimedPoint, ...], tuple[SkippedPoint, ...], CostCurve]:
    """Time ``plan``'s points (:meth:`Calibration.time_points`): the timed points, the skipped ones, the fit.
    Raises ModelFailure when none could be timed."""
    from kvcli.model.calibration import Calibration  # torch: only where a model runs

    calibration = Calibration(model, max_past_bytes=max_past_bytes)
    say = progress or (lambda *_: None)
    missed = calibration.time_points([(n, c) for _, n, c in plan], repeats,
                                     lambda done, total, p: say("prefill", done, total, _point_name(*p)))
    kinds = {(n, c): k for k, n, c in plan}
    skipped = tuple(SkippedPoint(kinds[n, c], n, c, why) for n, c, why in missed)
    seconds: dict[tuple[int, int], list[float]] = {}
    for s in calibration.samples:
        seconds.setdefault((s.new_tokens, s.cached_tokens), []).append(s.seconds)
    points = tuple(TimedPoint(k, n, c, tuple(seconds[n, c])) for k, n, c in plan if (n, c) in seconds)
    if not points:
        raise ModelFailure(f"no prefill could be timed on {model.device}: {skipped[0].reason}")
    return points, skipped, calibration.curve()


def measure_kv(model, codec: KvCodec, repeats: int = 3, progress: Progress | None = None) -> tuple[KvTiming, ...]:
    """Time the KV payload path on ``model``'s device at chunks of :data:`RATE_CHUNK_TOKENS` tokens of seeded
    random KV in its dtype, as payloads of ``codec.kv_dtype`` (fp8: quantized on save, dequantized on load):
    *save* = ``codec.encode`` of the chunk on the device (the copy to the host is the copy
    into the value), *load* = ``codec.decode`` of that value (as ``bytes``, as Redis returns it) and a copy of the
    tensor to the device; each between device synchronizations, on the prefill clock, after one untimed round;
    ``repeats`` rounds over the sizes.

    Raises:
        ModelFailure: a value did not decode or failed its checksum.
    """
    import torch

    clock, sync = prefill_clock(model), model.synchronize
    g = torch.Generator().manual_seed(0)
    chunks = {t: torch.randn(model.config.kv_shape(t), generator=g).to(model.dtype).to(model.device)
              for t in RATE_CHUNK_TOKENS}
    loads: dict[int, list[float]] = {t: [] for t in chunks}
    saves: dict[int, list[float]] = {t: [] for t in chunks}
    sizes: dict[int, int] = {}

    def load(value, checksum: bytes, kv: torch.Tensor) -> torch.Tensor:
        tensor = codec.decode(value, checksum, tuple(kv.shape), kv.dtype)
        if tensor is None:
            raise ModelFailure(f"a serialized KV chunk of {kv.shape[3]} tokens failed its checksum on load")
        return tensor.to(model.device, copy=True)

    done, total = 0, len(chunks) * repeats
    for r in range(repeats + 1):  # round 0: untimed
        for t, kv in chunks.items():
            if progress is not None and r:
                progress("kv", done, total, f"{t}-token chunk")
            sync()
            t0 = clock()
            value, checksum = codec.encode(kv)
            sync()
            t1 = clock()
            value = bytes(value)
            sync()
            t2 = clock()
            load(value, checksum, kv)
            sync()
            t3 = clock()
            sizes[t] = len(value)
            if r:
                saves[t].append(t1 - t0)
                loads[t].append(t3 - t2)
                done += 1
    if progress is not None:
        progress("kv", total, total, f"{RATE_CHUNK_TOKENS[-1]}-token chunk")
    return tuple(KvTiming(t, kv.numel() * kv.element_size(), sizes[t], tuple(loads[t]), tuple(saves[t]))
                 for t, kv in chunks.items())


def device_facts(device: torch.device) -> dict:
    """JSON-ready facts of ``device``: ``device`` (``"cuda:0"``, ``"cpu"``), ``type``, ``name`` (the GPU's,
    ``torch.cuda.get_device_name``; on the CPU its model from /proc/cpuinfo), ``memory_bytes`` (the GPU's total;
    the machine's RAM), ``capability`` (CUDA compute capability, ``"9.0"``), ``cuda_version`` (torch's CUDA),
    ``driver_version`` (the NVIDIA kernel module's, /proc/driver/nvidia/version), ``torch_version`` and
    ``torch_threads``; the three CUDA facts are None off a GPU or where unknown."""
    import torch

    facts: dict[str, Any] = {"device": str(device), "type": device.type, "name": cpu_model(),
                             "memory_bytes": ram_bytes(), "capability": None, "cuda_version": None,
                             "driver_version": None}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        facts.update(device=f"cuda:{index}", name=torch.cuda.get_device_name(index), memory_bytes=props.total_memory,
                     capability=f"{props.major}.{props.minor}", cuda_version=torch.version.cuda,
                     driver_version=_nvidia_driver())
    elif device.type != "cpu":
        facts["name"] = device.type
    facts.update(torch_version=torch.__version__, torch_threads=torch.get_num_threads())
    return facts


# -- helpers -----------------------------------------------------------------------------------------------------
def _kv_name(kv_dtype: str | None) -> str:
    """``--kv-dtype``'s spelling of a payload dtype: ``auto`` for None, ``fp8`` for float8_e4m3fn."""
    return "auto" if kv_dtype is None else "fp8"


def _point_name(new: int, cached: int) -> str:
    return f"{new:,} new" + (f" after {cached:,} cached" if cached else "")


def _rate(timings: tuple[KvTiming, ...], which: str) -> float | None:
    if not timings:
        return None
    largest = max(timings, key=lambda t: t.chunk_tokens)
    fastest = min(getattr(largest, which))
    return largest.value_bytes / fastest if fastest > 0 else None


def _nvidia_driver() -> str | None:
    with contextlib.suppress(OSError):
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as f:
            m = re.search(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]+)", f.readline())
            return m[1] if m else None
    return None


# -- reading -----------------------------------------------------------------------------------------------------
class _Invalid(Exception):
    """A profile document that does not hold: the reason, without the file's name."""


_NUM, _OPT_STR, _OPT_NUM = (float, int), (str, type(None)), (float, int, type(None))
#: The shapes every profile holds (a Llama's); the architecture fields after them are optional (absent in a
#: profile of a Llama-style model written before them: their defaults).
_SHAPES = {f.name: (float, int) if f.type in ("float", float) else (int if f.type in ("int", int) else str)
           for f in dataclasses.fields(ModelConfig)[:12]}
_ARCH_SHAPES = tuple(f.name for f in dataclasses.fields(ModelConfig)[12:])
_SCHEMA: dict[str, Any] = {
    "format": str, "kvcli_version": str, "created": str, "command_line": [str],
    "device": {"device": str, "type": str, "name": str, "memory_bytes": int, "capability": _OPT_STR,
               "cuda_version": _OPT_STR, "driver_version": _OPT_STR, "torch_version": str, "torch_threads": int},
    "host": {"cpu": str, "cores": int, "usable_cores": int, "platform": str, "python": str},
    "model": {"model_id": str, "model": str, "dtype": str, "shapes": _SHAPES},
    "clock": str, "max_tokens": int, "repeats": int, "max_past_bytes": int, "measure_seconds": _NUM,
    "points": [{"kind": str, "new_tokens": int, "cached_tokens": int, "seconds": [_NUM]}],
    "skipped_points": [{"kind": str, "new_tokens": int, "cached_tokens": int, "reason": str}],
    "fit": {"a_seconds": _NUM, "b_seconds_per_token": _NUM, "d_seconds_per_pair": _NUM,
            "e_seconds_per_cached_pair": _NUM, "samples": int, "points": int, "r2": _OPT_NUM,
            "max_rel_error": _OPT_NUM, "max_tokens": int, "longest_full_tokens": int, "relative_residuals": [_NUM]},
    "kv_rates": {"load_bytes_per_second": _OPT_NUM, "save_bytes_per_second": _OPT_NUM,
                 "timings": [{"chunk_tokens": int, "kv_bytes": int, "value_bytes": int, "load_seconds": [_NUM],
                              "save_seconds": [_NUM]}]},
}
#: An engine profile's ``engine`` object (absent or null in a local model's).
_ENGINE_SCHEMA: dict[str, Any] = {"url": str, "name": _OPT_STR, "version": _OPT_STR, "served_model": str,
                                  "block_size": (int, type(None))}
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", type(None): "null", list: "a list",
               dict: "an object", bool: "true/false"}


def _check(value, spec, where: str) -> None:
    """Raise _Invalid unless ``value`` has the shape of ``spec``: a type or tuple of types, ``[item spec]`` (a
    list), or ``{key: spec}`` (an object with at least these keys; others are ignored)."""
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise _Invalid(f"field {where}: expected an object, got {_TYPE_NAMES.get(type(value), type(value))}")
        for key, sub in spec.items():
            if key not in value:
                raise _Invalid(f"missing field {where + '.' if where else ''}{key}")
            _check(value[key], sub, f"{where + '.' if where else ''}{key}")
    elif isinstance(spec, list):
        if not isinstance(value, list):
            raise _Invalid(f"field {where}: expected a list, got {_TYPE_NAMES.get(type(value), type(value))}")
        for i, item in enumerate(value):
            _check(item, spec[0], f"{where}[{i}]")
    else:
        types = spec if isinstance(spec, tuple) else (spec,)
        if isinstance(value, bool) or not isinstance(value, types):
            want = " or ".join(_TYPE_NAMES[t] for t in types if not (t is int and float in types))
            raise _Invalid(f"field {where}: expected {want}, got {_TYPE_NAMES.get(type(value), type(value))}")
        if isinstance(value, float) and not math.isfinite(value):
            raise _Invalid(f"field {where}: not a finite number")


def _check_format(doc) -> None:
    if not isinstance(doc, dict):
        raise _Invalid(f"not a kvcli profile: the document is {_TYPE_NAMES.get(type(doc), type(doc))}, not an object")
    fmt = doc.get("format")
    if fmt is None:
        command = doc.get("command")
        what = f" (this is kvcli {command}'s JSON)" if isinstance(command, str) else ""
        raise _Invalid(f"not a kvcli profile: no \"format\" field{what}; make one with kvcli profile")
    name, _, version = str(fmt).partition("/")
    if name != FORMAT_NAME or not version.isdigit():
        raise _Invalid(f"not a kvcli profile: format {fmt!r}, expected {FORMAT!r}")
    if int(version) > FORMAT_VERSION:
        raise _Invalid(f"profile format {fmt} is newer than this kvcli reads ({FORMAT}); upgrade kvcli")
    if int(version) != FORMAT_VERSION:
        raise _Invalid(f"profile format {fmt} is not one this kvcli reads ({FORMAT})")


def _from_dict(doc) -> Profile:
    """The :class:`Profile` of a document (:meth:`Profile.to_dict`'s shape). Raises _Invalid."""
    _check_format(doc)
    _check(doc, _SCHEMA, "")
    model = doc["model"]
    try:
        dtype = check_dtype(model["dtype"])
    except BadInputError as exc:
        raise _Invalid(f"field model.dtype: {exc}") from None
    arch: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in model["shapes"].items()
                            if k in _ARCH_SHAPES}
    try:
        shapes = ModelConfig(**{k: model["shapes"][k] for k in _SHAPES}, **arch)
    except (BadInputError, TypeError) as exc:
        raise _Invalid(f"field model.shapes: {exc}") from None
    points = tuple(TimedPoint(p["kind"], p["new_tokens"], p["cached_tokens"], tuple(float(s) for s in p["seconds"]))
                   for p in doc["points"])
    if not points:
        raise _Invalid("field points: no timed point")
    for i, p in enumerate(points):
        if p.new_tokens < 1 or p.cached_tokens < 0 or not p.seconds or min(p.seconds) < 0:
            raise _Invalid(f"field points[{i}]: needs new_tokens >= 1, cached_tokens >= 0 and seconds >= 0 (at "
                           "least one)")
    pairs = sorted({(p.new_tokens, p.cached_tokens) for p in points})
    if not determines_curve(pairs):
        one = len(pairs) == 1
        raise _Invalid(f"field points: {len(pairs)} distinct (new, cached) token {'pair' if one else 'pairs'} "
                       f"that {'does' if one else 'do'} not determine the cost curve's 4 coefficients (it needs 3 "
                       "new-token counts and cached tokens at some point, as kvcli profile times them): every saving "
                       "would be priced from a guess; measure the profile again")
    timings = tuple(KvTiming(t["chunk_tokens"], t["kv_bytes"], t["value_bytes"],
                             tuple(float(s) for s in t["load_seconds"]), tuple(float(s) for s in t["save_seconds"]))
                    for t in doc["kv_rates"]["timings"])
    for i, t in enumerate(timings):
        if t.chunk_tokens < 1 or not t.load_seconds or not t.save_seconds or min(t.load_seconds + t.save_seconds) < 0:
            raise _Invalid(f"field kv_rates.timings[{i}]: needs chunk_tokens >= 1 and seconds >= 0 (at least one)")
    kv_dtype = doc["kv_rates"].get("kv_dtype")
    if kv_dtype is not None and (not isinstance(kv_dtype, str) or kv_dtype not in KV_PAYLOAD_DTYPES):
        raise _Invalid(f"field kv_rates.kv_dtype: expected null or {', '.join(KV_PAYLOAD_DTYPES)}, got {kv_dtype!r}")
    if doc["repeats"] < 1 or doc["max_tokens"] < 1:
        raise _Invalid("fields repeats and max_tokens must be >= 1")
    skipped = tuple(SkippedPoint(s["kind"], s["new_tokens"], s["cached_tokens"], s["reason"])
                    for s in doc["skipped_points"])
    engine = doc.get("engine")
    if engine is not None:
        _check(engine, _ENGINE_SCHEMA, "engine")
    return Profile(
        format=doc["format"], kvcli_version=doc["kvcli_version"], created=doc["created"],
        command_line=tuple(doc["command_line"]), device=dict(doc["device"]), host=dict(doc["host"]),
        model_id=model["model_id"], model=model["model"], dtype=dtype, shapes=shapes, clock=doc["clock"],
        max_tokens=doc["max_tokens"], repeats=doc["repeats"], max_past_bytes=doc["max_past_bytes"], points=points,
        skipped=skipped, fit=dict(doc["fit"]), kv_timings=timings, measure_seconds=float(doc["measure_seconds"]),
        kv_dtype=kv_dtype, engine=dict(engine) if engine is not None else None)
