"""What ``kvcli replay`` needs besides the replay itself: the model, the cost curve, the traces, the context.

Kept apart from the CLI so the library can run a whole replay (``run_replay``) without typer.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from kvcli.errors import BadInputError
from kvcli.model.costcurve import CostCurve, calibrate
from kvcli.model.presets import dtype_name, itemsize, model_spec
from kvcli.model.threads import cores
from kvcli.model.tokenize import get_tokenizer
from kvcli.replay.measure import curve_check
from kvcli.replay.parallel import Workers
from kvcli.replay.replayer import Replayer
from kvcli.replay.results import ReplayConfig, TraceResult
from kvcli.store.batch import SAMPLE_EVERY
from kvcli.store.cluster import server_version
from kvcli.store.server import RedisTarget
from kvcli.traces.detect import detect_format, read_trace
from kvcli.traces.paths import expand_paths


@dataclass(frozen=True)
class ModelOptions:
    """Which local model: ``preset`` (see model.PRESETS), ``dtype`` name or None for the preset's, ``device``,
    ``seed``; ``prefill_tps`` replaces the calibrated cost curve with a constant tokens/s when given; ``threads``:
    torch threads per process, None to measure (kvcli.model.threads)."""

    preset: str = "cpu"
    dtype: str | None = None
    device: str = "auto"
    seed: int = 0
    prefill_tps: float | None = None
    threads: int | None = None


# Prefill points timed before replaying (new tokens x cached tokens), each twice: a few seconds on 2 CPU cores.
CALIBRATION_LENGTHS = (32, 128, 512)
CALIBRATION_CACHED = (0, 512)


def prepare_model(options: ModelOptions, measure: int | None, jobs: int = 1):
    """Build the model when anything will run it, choose its torch threads (given, or measured for ``jobs``
    parallel replays), and the cost curve (calibrated now, with those threads, or from ``prefill_tps``).

    Returns ``(model or None, curve, calibration samples, spec, thread choice or None)``.

    Raises:
        BadInputError: unknown preset or dtype; no way to estimate prefill (nothing measured, no tps).
        ModelFailure: the model does not fit in memory.
    """
    spec = model_spec(options.preset, options.dtype, options.seed)  # validates preset and dtype first
    if options.threads is not None and options.threads < 1:
        raise BadInputError(f"--threads must be >= 1 or auto, got {options.threads}")
    if options.prefill_tps is not None and measure == 0:
        return None, CostCurve.from_tokens_per_second(options.prefill_tps), [], spec, None
    from kvcli.model.llama import build_model  # torch: only where a model runs
    from kvcli.model.threads import choose_threads

    model = build_model(options.preset, options.dtype, options.device, options.seed)
    threads = choose_threads(model, options.threads, jobs)
    if options.prefill_tps is not None:
        return model, CostCurve.from_tokens_per_second(options.prefill_tps), [], spec, threads
    samples = calibrate(model, lengths=CALIBRATION_LENGTHS, cached=CALIBRATION_CACHED, repeats=3, seed=options.seed)
    return model, CostCurve.fit(samples), samples, spec, threads


def default_jobs(chunk_sizes: tuple[int, ...]) -> int:
    """``--jobs`` by default: the cores this process may use, at most one per chunk size."""
    return max(1, min(cores(), len(chunk_sizes)))


def run_replay(client: redis.Redis, target: RedisTarget, paths: list[Path], config: ReplayConfig,
               model_options: ModelOptions, fmt: str = "auto", tokenizer: str = "cl100k_base",
               progress: Callable[[str, int, int | None], None] | None = None, jobs: int | None = 1
               ) -> tuple[list[TraceResult], dict]:
    """Replay each trace file in turn (each cold, in its own namespaces) and return results and run context.

    ``jobs``: processes replaying one trace's chunk sizes at once (kvcli.replay.parallel; None: one per core, at
    most one per chunk size); the results are those of one process.
    """
    files = expand_paths(paths)
    jobs = default_jobs(config.chunk_sizes) if jobs is None else jobs
    if jobs < 1:
        raise BadInputError(f"--jobs must be >= 1, got {jobs}")
    jobs = min(jobs, len(config.chunk_sizes))
    if fmt != "mooncake" and (fmt != "auto" or any(detect_format(f) != "mooncake" for f in files)):
        get_tokenizer(tokenizer)  # an unknown tokenizer fails now, not at the first text record (Mooncake has none)
    model, curve, _, spec, threads = prepare_model(model_options, config.measure, jobs)
    replayer = Replayer(client, model, curve, tokenizer, config, spec=spec)
    results = []
    with (Workers(jobs) if jobs > 1 else contextlib.nullcontext()) as workers:
        for path in files:
            def step(done: int, total: int | None, _name=path.name) -> None:
                if progress:
                    progress(_name, done, total)
            reader = lambda p=path: read_trace(p, fmt, tokenizer)  # noqa: E731
            if workers is not None:
                model_args = (model_options.preset, model_options.dtype, model_options.device, model_options.seed)
                results.append(workers.replay(replayer, target.url, str(path), reader, fmt, tokenizer, model_args,
                                              threads.threads if threads else None, step))
            else:
                results.append(replayer.replay(str(path), reader, step))
    layers, two, heads, dim = spec.kv_shape
    context = {
        "model_id": spec.model_id, "preset": model_options.preset, "dtype": dtype_name(spec.dtype),
        "kv_bytes_per_token": layers * two * heads * dim * itemsize(spec.dtype), "tokenizer": tokenizer,
        "device": str(model.device) if model is not None else "no device (model not run)",
        "redis": target.label, "redis_cluster": target.cluster, "redis_shards": target.shards,
        "redis_version": server_version(client), "cost_curve": replayer.curve.to_dict(),
        "cost_curve_vs_measured": curve_check(replayer.curve, replayer.measured_samples),
        "cost_curve_source": "prefill_tps" if model_options.prefill_tps else "measured in this run",
        "key_layout": "kvcli:v1:{namespace}:{chunk_size}:{m|p}:{hash hex}",
        "metadata_placement": "beside the payload (its own key)",
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.__dict__.items()},
        "jobs": jobs, "torch_threads": threads.to_dict() if threads else None,
        "torch_threads_text": threads.describe() if threads else "model not run",
        "lookup_latency": (f"sampled: 1 in {SAMPLE_EVERY} requests also timed an unpipelined lookup; the others were "
                           f"pipelined, {config.pipeline} per round trip" if config.pipeline > 1
                           else "every lookup timed one by one"),
    }
    return results, context
