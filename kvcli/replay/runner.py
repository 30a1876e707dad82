"""What ``kvcli replay`` needs besides the replay itself: the model, the cost curve, the traces, the context.

Kept apart from the CLI so the library can run a whole replay (``run_replay``) without typer.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import redis
from redis.cluster import RedisCluster

from kvcli.errors import BadInputError
from kvcli.model.checkpoint import is_checkpoint_name
from kvcli.model.costcurve import CostCurve, PrefillCost
from kvcli.model.hardware import PCIE5_X16, get_accelerator
from kvcli.model.kvmemory import gpu_tier
from kvcli.model.load import describe, load_model, model_shapes, resolve_spec, resolve_tokenizer
from kvcli.model.presets import ModelConfig, ModelSpec
from kvcli.model.profile import Profile
from kvcli.model.roofline import MIN_MFU, Roofline
from kvcli.model.threads import torch_threads
from kvcli.model.tokenize import lazy_tokenizer
from kvcli.replay.answer import answer_of
from kvcli.replay.events import ReplayEvents
from kvcli.replay.measure import curve_check
from kvcli.replay.network import DeviceRates
from kvcli.replay.parallel import Setup, describe_units, make_units, reply_timeout
from kvcli.replay.replayer import Replayer, check_prompts
from kvcli.replay.results import CapacityBasis, Pricing, ReplayConfig, TraceResult, check_count, check_positive
from kvcli.store.calls import resend
from kvcli.store.lmcache import KEY_FORMAT, LMCACHE_COMMIT, LMCACHE_VERSION, RESP_KEY_FORMAT, lmcache_layouts
from kvcli.store.lmcache_mp import MP_KEY_FORMAT
from kvcli.store.namespace import purge_command
from kvcli.store.preflight import server_memory
from kvcli.store.serde import SCALE_BYTES, state_bytes
from kvcli.store.server import INFO_REFUSED, RedisTarget, server_info
from kvcli.traces.bos import trace_bos_note
from kvcli.traces.detect import outline_trace, read_trace, trace_note
from kvcli.traces.paths import display_name, expand_paths
from kvcli.units import check_seed, dtype_bytes, dtype_key, fmt_bytes

if TYPE_CHECKING:
    from kvcli.model.calibration import Calibration
    from kvcli.traces.hashids import TraceFormat


@dataclass(frozen=True)
class ModelOptions:
    """Which local model, and what prices its prefill.

    Attributes:
        model: a preset name (see model.PRESETS) or a Hugging Face checkpoint folder.
        dtype: dtype name, or None for the model's own. device: where it runs. seed: a preset's weights.
        prefill_tps: price prefill at this constant tokens/s instead of calibrating here (KV to and from the
            device over an assumed PCIe 5.0 x16 link: :func:`flat_rate_device`).
        threads: torch threads while the replay runs on a CPU (1 by default: on a small machine shared with other
            work, one thread's timings repeat within a few percent; two threads' swing several-fold with the load).
        hardware: price prefill on this named accelerator (:mod:`kvcli.model.hardware`, a roofline of the model's
            exact FLOPs and bytes: :mod:`kvcli.model.roofline`) instead of calibrating here; with ``profile``, only
            the accelerator the GPU tier is sized on (the profile prices prefill: measured, it is preferred over any
            utilization).
        mfu: the roofline's utilization (None: the accelerator's published one at the precision,
            :func:`kvcli.model.utilization.utilization`); its interval keeps the published interval's relative
            spread around it.
        profile: price prefill, and moving KV to and from the device, with a profile ``kvcli profile`` measured
            (a JSON file: :class:`kvcli.model.profile.Profile`; an engine's with ``--engine``) for this model's
            shapes and dtype.
        precision: the roofline's matrix-multiply precision: None (or "auto") for the model's dtype (bf16 or
            fp16), "fp8" for W8A8 FP8 as engines serve an FP8 checkpoint (vLLM ``--quantization fp8``, TensorRT-LLM
            FP8): the FP8 dense peak at the accelerator's fp8 utilization, weights and activations 1 byte each.

    Raises:
        BadInputError: ``seed`` outside ``[0, 2**63 - 1]``; ``threads`` < 1; ``prefill_tps`` not a positive
            number; ``prefill_tps`` with ``hardware`` or ``profile``; ``mfu`` without ``hardware`` or outside
            ``[MIN_MFU, 1]``; ``mfu`` or ``precision`` fp8 with ``profile`` (its measured times price prefill, no
            utilization) or without ``hardware``; an unknown precision or accelerator.
    """

    model: str = "cpu"
    dtype: str | None = None
    device: str = "auto"
    seed: int = 0
    prefill_tps: float | None = None
    threads: int | None = 1
    hardware: str | None = None
    mfu: float | None = None
    profile: str | None = None
    precision: str | None = None

    def __post_init__(self) -> None:
        check_seed(self.seed)
        check_count("--threads", self.threads)
        check_positive("--prefill-tps", self.prefill_tps)
        if self.prefill_tps is not None:
            given = [flag for flag, value in (("--hardware", self.hardware), ("--prefill-profile", self.profile))
                     if value is not None]
            if given:
                raise BadInputError(f"--prefill-tps and {given[0]} both price prefill: give one")
        if self.precision not in (None, "auto", "fp8"):
            raise BadInputError(f"--precision must be auto or fp8, got {self.precision!r}")
        roofline = [flag for flag, used in (("--mfu", self.mfu is not None), ("--precision fp8", self.fp8)) if used]
        if roofline and self.profile is not None:
            raise BadInputError(f"{roofline[0]} sets the roofline's utilization or precision, but --prefill-profile "
                                f"prices prefill from its measured times (preferred over any MFU): give one")
        if self.mfu is not None and self.hardware is None:
            raise BadInputError("--mfu sets the roofline's utilization: it needs --hardware")
        if self.fp8 and self.hardware is None:
            raise BadInputError("--precision fp8 sets the roofline's precision: it needs --hardware")
        if self.mfu is not None and not MIN_MFU <= self.mfu <= 1:
            raise BadInputError(f"--mfu must be in [{MIN_MFU}, 1] (the share of the dense peak a prefill reaches), "
                                f"got {self.mfu}")
        if self.hardware is not None:
            get_accelerator(self.hardware)

    @property
    def fp8(self) -> bool:
        """Whether the roofline prices W8A8 FP8 (``--precision fp8``)."""
        return self.precision == "fp8"

    @property
    def priced(self) -> bool:
        """Whether something other than this machine prices prefill (a flat rate, a named accelerator, a profile):
        then every overhead is priced too (:func:`kvcli.replay.network.priced_overheads`), none timed here."""
        return self.prefill_tps is not None or self.hardware is not None or self.profile is not None


class Prepared(NamedTuple):
    """What :func:`prepare_model` built: the model (None when nothing runs it), the prefill cost, the calibration
    that extends it per trace (None: the cost is fixed), the model's spec, and the serving device's host <-> device
    rates (None unless prefill is priced: :attr:`ModelOptions.priced`)."""

    model: Any  # a LocalModel or an HFModel: prefill, synchronize, device, spec
    cost: PrefillCost
    calibration: Calibration | None
    spec: ModelSpec
    device: DeviceRates | None


def prepare_model(options: ModelOptions, measure: int | None, phase: Callable[[str], None] | None = None,
                  kv_dtype: str | None = None) -> Prepared:
    """Build the model when anything will run it, and the prefill cost: the calibration's base points timed now
    (:class:`~kvcli.model.calibration.Calibration`, extended per trace by the replay), ``prefill_tps``, or a named
    accelerator's roofline (its KV traffic at ``kv_dtype``'s element size: the replay's ``--kv-dtype``, torch's
    name, None for the model's dtype), or a profile (measured with that ``--kv-dtype``). ``phase`` is told
    "calibrating prefill ..." as the base points begin (:meth:`kvcli.replay.events.ReplayEvents.phase`).

    Raises:
        BadInputError: unknown preset, checkpoint folder, dtype or accelerator; a dtype the accelerator has no
            tensor-core figure for.
        ModelFailure: the model does not fit in memory or cannot be loaded.
    """
    spec = resolve_spec(options.model, options.dtype, options.seed)  # validates model and dtype first
    fixed: PrefillCost | None = None
    device = None
    if options.prefill_tps is not None:
        fixed, device = CostCurve.from_tokens_per_second(options.prefill_tps), flat_rate_device()
    elif options.profile is not None:  # measured: preferred over the roofline's utilization
        fixed, device = profile_cost(options.profile, model_shapes(options.model), spec, kv_dtype)
    elif options.hardware is not None:
        fixed, device = roofline_cost(options, spec, kv_dtype)
    if fixed is not None and measure == 0:
        return Prepared(None, fixed, None, spec, device)
    model = load_model(options.model, options.dtype, options.device, options.seed)
    if fixed is not None:
        return Prepared(model, fixed, None, spec, device)
    from kvcli.model.calibration import Calibration  # torch: only where a model runs

    if phase is not None:
        phase(f"calibrating prefill on {model.device}: timing the base points")
    calibration = Calibration(model, seed=options.seed)
    calibration.cover(1, 0.0)  # the base points
    return Prepared(model, calibration.curve(), calibration, spec, None)


def flat_rate_device() -> DeviceRates:
    """The host <-> device rates a flat ``--prefill-tps`` replay assumes, no accelerator being named: PCIe 5.0 x16
    at its peak rate, one direction (:data:`kvcli.model.hardware.PCIE5_X16`: the host link of the H100, H200, B200
    and MI300X, so the same overheads as ``--hardware`` on one of them)."""
    name, rate = PCIE5_X16
    return DeviceRates(rate, rate, f"{name} at its peak rate (assumed: no accelerator named)")


def profile_cost(path: str, shapes: ModelConfig, spec: ModelSpec,
                 kv_dtype: str | None = None) -> tuple[CostCurve, DeviceRates]:
    """The cost curve a profile's points fit, and its measured KV load and save rates (of payloads in
    ``kv_dtype``, torch's name; None: the model's dtype).

    Raises:
        BadInputError: the file is not a profile; it was measured for other shapes, another dtype or another
            ``--kv-dtype`` (the message names the options it was measured with); it holds no KV rates.
    """
    from kvcli.model.profile import Profile  # only where a profile prices the replay

    profile = Profile.load(path)
    why = profile.matches(shapes, spec.dtype, kv_dtype)
    if why:
        raise BadInputError(f"--prefill-profile: {why}", path=path)
    load, save = profile.load_bytes_per_second, profile.save_bytes_per_second
    if not load or not save:
        raise BadInputError("--prefill-profile: the profile holds no KV load/save rates (kv_rates)", path=path)
    where = f"{profile.device.get('name') or profile.device.get('device')}, measured by the profile"
    return profile.curve(), DeviceRates(load, save, where)


def roofline_cost(options: ModelOptions, spec: ModelSpec,
                  kv_dtype: str | None = None) -> tuple[Roofline, DeviceRates]:
    """The roofline of ``options.model``'s shapes on ``options.hardware`` at the precision priced
    (:func:`compute_precision`), at its published utilization there or ``options.mfu`` (the published interval's
    relative spread kept around it; :class:`kvcli.model.roofline.Roofline`), its KV read and written at
    ``kv_dtype``'s element size (torch's name as :func:`kvcli.store.serde.check_kv_dtype` gives it, None:
    ``spec.dtype``'s), and the device's host link as its KV load and save rates.

    Raises:
        BadInputError: an unknown accelerator; a dtype it has no tensor-core figure or published utilization for.
    """
    assert options.hardware is not None
    accelerator = get_accelerator(options.hardware)
    dtype, element_bytes = compute_precision(options, spec)
    cost = Roofline(model_shapes(options.model), accelerator, element_bytes, dtype, options.mfu, None,
                    dtype_bytes(kv_dtype or spec.dtype))
    link = accelerator.host_bytes_per_second
    return cost, DeviceRates(link, link, f"{accelerator.label}'s {accelerator.host_link} at its peak rate")


def compute_precision(options: ModelOptions, spec: ModelSpec) -> tuple[str, int]:
    """The compute dtype a roofline prices at and the bytes of a weight in it: ``("float8", 1)`` with
    ``--precision fp8`` (W8A8 FP8: weights stored in 1 byte), else the model's dtype and its element size."""
    if options.fp8:
        return "float8", 1
    return dtype_key(spec.dtype), dtype_bytes(spec.dtype)


def run_replay(client: redis.Redis | RedisCluster, target: RedisTarget, paths: str | Path | list, config: ReplayConfig,
               model_options: ModelOptions, fmt: str | TraceFormat = "auto", tokenizer: str | None = None,
               events: ReplayEvents | None = None, jobs: int | None = 1,
               ray: str | None = None) -> tuple[list[TraceResult], dict]:
    """Replay each trace file in turn (each cold, in its own namespaces) and return results and run context.

    ``paths``: trace files or directories (a single path may be given as it is).

    ``jobs``: worker processes for a trace's independent units (kvcli.replay.parallel; 1, the default: this
    process alone; None: the CLI's default, the cores for a replay that runs no model), or Ray tasks on the
    cluster at ``ray`` (an address, or "local"; ``jobs=None``: as many tasks per trace as the cluster has CPUs);
    the results are identical to ``jobs=1``. More than one job from a
    Python script needs the ``if __name__ == "__main__":`` guard (each worker imports the script again).

    ``tokenizer``: a tiktoken name or a tokenizer folder; None for the checkpoint's own tokenizer when
    ``model_options.model`` is a folder that has one, else ``cl100k_base`` (:func:`resolve_tokenizer`).
    ``events`` hears each phase as it begins, the requests done, each trace's result as soon as it is done and
    the lines for the user (:class:`~kvcli.replay.events.ReplayEvents`; None: nothing is told).
    ``fmt``: a format name, or a :class:`~kvcli.traces.hashids.TraceFormat` with hash-id declarations; a hash-id
    trace's result gets a note on how it was read (:func:`kvcli.traces.detect.trace_note`).
    """
    files = expand_paths([Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths])
    tokenizer = resolve_tokenizer(tokenizer, model_options.model)
    tok_name = lazy_tokenizer(tokenizer)[1]  # tiktoken loads only when a record holds text
    if config.priced != model_options.priced:  # one pricing for everything: what prices prefill prices overheads
        config = dataclasses.replace(config, priced=model_options.priced)
    runs_model = not (model_options.priced and config.measure == 0)
    events = events or ReplayEvents()
    # a bad trace is refused before the model loads and calibrates (tens of seconds on a CPU), and before any
    # trace's report is done (a replay that fails prints none)
    if runs_model or len(files) > 1:
        events.phase(f"checking {len(files)} trace{'s' if len(files) > 1 else ''}")
        for path in files:
            outline = itertools.islice(TraceSource(path, fmt, tokenizer).outline(), config.limit)
            check_prompts((request.prompt_tokens for request in outline), display_name(path))
    if is_checkpoint_name(model_options.model):  # transformers' import and its config classes: seconds
        events.phase(f"reading the model's config: {model_options.model}")
    if runs_model:  # torch's import (a second or more) starts here
        where = "" if model_options.device == "auto" else f" on {model_options.device}"
        spec_id = resolve_spec(model_options.model, model_options.dtype, model_options.seed).model_id
        events.phase(f"loading the model {spec_id}{where}")
    with torch_threads(model_options.threads if runs_model else None), contextlib.ExitStack() as stack:
        model, curve, calibration, spec, device = prepare_model(model_options, config.measure, events.phase,
                                                                config.kv_dtype)
        shapes = model_shapes(model_options.model)
        config, capacity = resolve_capacity(config, model_options, shapes, spec)
        units = make_units(jobs, ray, Setup(target.url, reply_timeout(client), model_options, tok_name, spec, shapes,
                                            config, f"kvcli-replay-{os.getpid()}-worker"), target.embedded, runs_model)
        if units is not None:  # on an error or an interrupt at once (no unit is running then: nothing to wait
            # for, and workers still starting would make a refused replay wait out their imports); else after them
            stack.push(lambda kind, *_: units.close(terminate=kind is not None))
        replayer = Replayer(client, model, curve, tok_name, config, spec=spec, calibration=calibration,
                            model_config=shapes, notify=events.note, remedy=functools.partial(purge_remedy, target),
                            units=units, prefetch=False if jobs == 1 else None,  # --jobs 1: this process alone
                            device=device, phase=events.phase, own_server=target.embedded, capacity=capacity,
                            cost_source=_cost_source(model_options, curve))
        results = []
        pricing = answer_pricing(model_options, config, model)
        for i, path in enumerate(files, 1):
            name = display_name(path)
            events.phase(f"trace {i} of {len(files)}: {name}")
            step = functools.partial(events.requests, Path(name).name)
            results.append(replayer.replay(name, TraceSource(path, fmt, tokenizer), step))
            notes = (trace_note(path, fmt), trace_bos_note(path, fmt, lazy_tokenizer(tokenizer)[0]))
            results[-1].notes += [note for note in notes if note]
            results[-1].answer = answer_of(results[-1], pricing, capacity_words(config))
            events.trace_done(results[-1])
    layers, two = spec.kv_shape[:2]
    context = {
        "model_id": spec.model_id, **describe(model_options.model), "dtype": str(spec.dtype).removeprefix("torch."),
        "kv_dtype": config.kv_dtype or dtype_key(spec.dtype),
        "kv_bytes_per_token": kv_bytes_per_token(spec, config.kv_dtype),
        "kv_scale_bytes_per_chunk": layers * two * SCALE_BYTES if config.kv_dtype else 0,
        "state_bytes_per_chunk": state_bytes(spec.state_shape, spec.dtype), "tokenizer": tok_name,
        "tokenizer_source": tokenizer,
        "device": str(model.device) if model is not None else "no device (model not run)",
        "redis": target.display + (" (embedded)" if target.embedded else ""),
        "redis_version": _server_version(client), "server_cpu_seconds": _own_server_cpu(client, target.embedded),
        "cost_curve": replayer.curve.to_dict(),
        "cost_curve_vs_measured": curve_check(replayer.curve, replayer.measured_samples),
        "cost_curve_source": _cost_source(model_options, replayer.curve),
        "device_rates": device.to_dict() if device is not None else None,
        "calibration_seconds": calibration.spent_seconds if calibration else 0.0,
        "torch_threads": model_options.threads, "store_mode": config.store_mode, "units": describe_units(units),
        "key_layout": "kvcli:v1:{namespace}:{chunk_size}:{m|p}:{hash hex}",
        "metadata_placement": "beside the payload (its own key)",
        "layouts": {name: LAYOUT_NOTES[name] for name in config.layouts},
        "capacity": capacity.to_dict(),
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.__dict__.items()},
    }
    return results, context


LAYOUT_NOTES = {
    "kvcli": {"keys": "kvcli:v1:{namespace}:{chunk_size}:{m|p}:{hash hex}",
              "lookup": "one round trip per request (EVAL_RO; on a Redis Cluster one per shard, all at once)"},
    "lmcache": {"keys": KEY_FORMAT, "lookup": "one EXISTS per chunk, in order, until the first miss",
                "matched": f"LMCache {LMCACHE_VERSION} (git {LMCACHE_COMMIT}), redis:// connector",
                "model_name": "{namespace}/{chunk_size}/{model id} in this replay"},
    "lmcache-resp": {"keys": RESP_KEY_FORMAT, "lookup": "one EXISTS per chunk, all in one round trip",
                     "matched": f"LMCache {LMCACHE_VERSION} (git {LMCACHE_COMMIT}), resp:// connector",
                     "model_name": "{namespace}/{chunk_size}/{model id} in this replay"},
    "lmcache-mp": {"keys": MP_KEY_FORMAT, "lookup": "one EXISTS per chunk, all in one round trip",
                   "matched": f"LMCache {LMCACHE_VERSION} (git {LMCACHE_COMMIT}), multiprocess mode's RESP L2 adapter",
                   "model_name": "{namespace}/{chunk_size}/{model id} in this replay; kv_rank 01000100 (world size "
                                 "1, rank 0); object group 0; no cache_salt field (the salt is in the hash)"},
}


def answer_pricing(options: ModelOptions, config: ReplayConfig, model: Any = None) -> Pricing:
    """What priced the replay's prefill, for its answer (:class:`kvcli.replay.results.Pricing`): ``--prefill-tps``,
    ``--hardware``, ``--prefill-profile``, else this machine (its device: ``model``'s, when one runs); with
    ``--price gpu-hour``."""
    gpu_hour = config.plan.prices.gpu_hour if config.plan.prices is not None else None
    if options.prefill_tps is not None:
        return Pricing("rate", f"{options.prefill_tps:,g} tokens/s", gpu_hour)
    if options.profile is not None:  # measured: preferred over the roofline of an accelerator also named
        return Pricing("profile", f"the profile {Path(options.profile).name}", gpu_hour)
    if options.hardware is not None:
        return Pricing("roofline", get_accelerator(options.hardware).label, gpu_hour)
    return Pricing("timed", str(model.device) if model is not None else "cpu", gpu_hour)


def capacity_words(config: ReplayConfig) -> str | None:
    """The replay's LRU capacity per chunk size in words ("64.0 GiB", "3,000,000 tokens", both when both are
    given); None: unbounded."""
    parts = [f"{config.capacity_tokens:,} tokens" if config.capacity_tokens else "",
             fmt_bytes(config.capacity_bytes) if config.capacity_bytes else ""]
    return " or ".join(p for p in parts if p) or None


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str | None = None) -> int:
    """KV bytes per token of ``spec``'s attention layers, at ``kv_dtype`` (torch's name; None: the model's dtype):
    what a stored chunk holds per token, linear layers' state aside."""
    layers, two, heads, dim = spec.kv_shape
    return layers * two * heads * dim * dtype_bytes(kv_dtype or spec.dtype)


def resolve_capacity(config: ReplayConfig, options: ModelOptions, shapes: ModelConfig, spec: ModelSpec
                     ) -> tuple[ReplayConfig, CapacityBasis]:
    """The replay's cache capacity and what set it. A capacity given (``capacity_tokens`` / ``capacity_bytes``)
    stands; ``config.capacity`` "unlimited" keeps none; "auto" gives the per-node GPU tier of the accelerator named
    (``--hardware``, else a GPU profile's device: :func:`kvcli.model.kvmemory.gpu_tier` on the model's weights at
    the precision priced, :func:`compute_precision`, and its KV per token at the cache's), as ``capacity_bytes``,
    and none where no
    accelerator is named, where the weights fit no node, or with LMCache's layout (it replays without a
    capacity); the basis says which.

    Raises:
        BadInputError: ``options.profile`` is not a readable profile.
    """
    if config.capacity_tokens or config.capacity_bytes:
        return config, CapacityBasis("given", "--capacity-tokens / --capacity-bytes")
    if config.capacity == "unlimited":
        return config, CapacityBasis("unlimited", "asked for with --capacity unlimited")
    device = _serving_device(options)
    if device is None:
        return config, CapacityBasis("unlimited", "no accelerator named to size a GPU tier on; --hardware NAME "
                                                  "or --capacity SIZE sets one")
    if lmc := lmcache_layouts(config.layouts):
        return config, CapacityBasis("unlimited", f"--layout {lmc[0]} replays without a capacity")
    label, memory, max_devices, source = device
    weights = shapes.params() * compute_precision(options, spec)[1]  # FP8 weights: 1 byte each
    tier = gpu_tier(label, memory, weights, kv_bytes_per_token(spec, config.kv_dtype), shapes.context, source,
                    max_devices=max_devices)
    if tier is None:
        return config, CapacityBasis("unlimited", f"the weights, {weights / 2 ** 30:,.1f} GiB, and one context of "
                                                  f"KV fit no node of up to {max_devices} x {label}")
    return dataclasses.replace(config, capacity_bytes=tier.kv_bytes), CapacityBasis(
        "gpu tier", f"the per-node GPU tier of {source}", tier)


def _serving_device(options: ModelOptions) -> tuple[str, float, int, str] | None:
    """The accelerator the GPU tier is sized on: ``--hardware`` (also beside a profile, which then prices prefill
    only), else a GPU profile's device: its name, memory (bytes), devices a node may have, and where the memory
    figure comes from; None without one (a flat rate, or a profile measured on a CPU)."""
    if options.hardware is not None:
        acc = get_accelerator(options.hardware)
        return acc.label, acc.memory_bytes, 8, f"--hardware {acc.name}"
    if options.profile is not None:
        from kvcli.model.profile import Profile

        facts = Profile.load(options.profile).device
        if facts.get("type") == "cuda" and facts.get("memory_bytes"):  # one device, as the profile measured it
            return str(facts.get("name") or facts["device"]), float(facts["memory_bytes"]), 1, "the profile's device"
    return None


def _cost_source(options: ModelOptions, curve: PrefillCost) -> str:
    """What priced the prefill, for the report: a flat rate; a profile (an engine's: its name, version and URL),
    measured and so preferred over the utilization of an accelerator also named; a roofline, with the precision
    and utilization it used; or this run's measurements."""
    if options.prefill_tps is not None:
        return f"flat rate: --prefill-tps {options.prefill_tps:g}"
    if options.profile is not None:
        engine = Profile.load(options.profile).engine
        what = "measured"
        if engine:
            name = " ".join(str(engine[k]) for k in ("name", "version") if engine.get(k)) or "an engine"
            what = f"times to first token of {name} at {engine.get('url')}, measured"
        beside = (f"; preferred over --hardware {options.hardware}'s MFU (that accelerator sizes the GPU tier "
                  f"only)" if options.hardware is not None else "")
        return f"profile: {options.profile} ({what}){beside}"
    if isinstance(curve, Roofline):
        precision = "fp8" if options.fp8 else curve.compute_dtype.replace("bfloat", "bf").replace("float", "fp")
        return f"roofline: {curve.accelerator.label}, {precision} at MFU {curve.share:.2f}"
    return "measured in this run"


@dataclass(frozen=True)
class TraceSource:
    """A picklable reader of one trace file (worker processes and Ray tasks read it themselves): called, a fresh
    iterator over its requests (:func:`kvcli.traces.detect.read_trace`; ``tokenizer`` as :func:`lazy_tokenizer`
    takes it)."""

    path: Path
    fmt: str | TraceFormat
    tokenizer: str

    def __call__(self):
        return read_trace(self.path, self.fmt, lazy_tokenizer(self.tokenizer)[0])

    def outline(self):
        """A fresh iterator over the requests' lengths and times (:func:`kvcli.traces.detect.outline_trace`), with
        the same checks: a replay's first pass, cheaper than reading the requests where the format allows."""
        return outline_trace(self.path, self.fmt, lazy_tokenizer(self.tokenizer)[0])


def _itemsize(dtype) -> int:
    return dtype_bytes(dtype)


def _own_server_cpu(client: redis.Redis | RedisCluster, embedded: bool) -> float | None:
    """The embedded server's CPU seconds from its start to now (``INFO cpu``: ``used_cpu_user + used_cpu_sys``, every
    thread of its process; the background freeing of the keys a trace's cleanup dropped may still be running).
    None on a given server, whose count holds other clients' work and its life before this command, or where INFO
    is refused."""
    if not embedded or not isinstance(client, redis.Redis):
        return None
    info = server_info(client, "cpu")
    if not info or "used_cpu_user" not in info:
        return None
    return round(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]), 3)


def _server_version(client: redis.Redis | RedisCluster) -> str:
    """The server's version for the report's context, read by the replay's rule on failed calls
    (:func:`kvcli.store.calls.resend`); "?" with why when this user may not run INFO."""
    mem = resend(client, functools.partial(server_memory, client))  # a cluster's first primary's, or "mixed"
    return mem.version if mem.known else f"? ({INFO_REFUSED})"


def purge_remedy(target: RedisTarget, namespace: str) -> str:
    """How to remove what a run left: the exact ``kvcli purge`` command, or, on the embedded server, that the keys
    go with it."""
    if target.embedded:
        return "they go with the embedded server, which stops now"
    return f"remove them with: {purge_command(target, namespace)}"
