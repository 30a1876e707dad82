"""``kvcli profile``: the typer command over :mod:`kvcli.model.profile` (registered by :mod:`kvcli.cli.app` as
``app.command("profile")(handle_errors(profile))``), its stdout tables, and the store's payload path it times.

Results go to stdout (tables, or the profile document with ``--json``), progress to stderr: a rich bar on a
terminal, else one line per phase. kvcli's errors propagate to ``handle_errors`` (one line, the error's exit code).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvcli.cli.options import Device, Dtype, JsonOut, KvDtype, Threads
from kvcli.errors import BadInputError

if TYPE_CHECKING:  # kvcli.model.profile loads on use: `kvcli --help` never imports torch
    from kvcli.model.profile import KvCodec, Profile

err = Console(stderr=True, soft_wrap=True)  # never hard-wrapped: a grep must find a line whole


ProfileModel = Annotated[Optional[str], typer.Option(
    "--model", help="Model preset or local Hugging Face checkpoint folder (default: cpu). With --engine: the served "
                    "model's shapes, a preset or its config folder (default: the served model, when it is a folder "
                    "here).", show_default=False)]


def profile(
    out: Annotated[Path, typer.Option("--out", help="The profile file to write (JSON).", show_default=False)],
    model: ProfileModel = None, dtype: Dtype = None, device: Device = "auto",
    max_tokens: Annotated[Optional[int], typer.Option(
        help="Longest point timed, new + cached tokens (512 to the model's context length, its default).",
        show_default=False)] = None,
    repeats: Annotated[int, typer.Option(help="Timings of each point and chunk size, interleaved (1 to 100).")] = 3,
    threads: Threads = 1,
    kv_dtype: KvDtype = "auto",
    json_out: JsonOut = False,
    engine: Annotated[Optional[str], typer.Option(
        help="Time a running OpenAI-compatible engine (e.g. vLLM) at this URL through its API instead of a "
             "local model: time to first token after confirmed cached prefixes. An API key: $KVCLI_ENGINE_API_KEY.",
        show_default=False)] = None,
    served_model: Annotated[Optional[str], typer.Option(
        help="With --engine: the served model to time (default: the first GET /v1/models lists).",
        show_default=False)] = None,
    warmup: Annotated[int, typer.Option(help="With --engine: untimed warm-up rounds, each a prefix and a hit on it "
                                             "(they also check that the engine confirms hits).")] = 2,
) -> None:
    """Measure prefill cost on a device, or through an engine's API.

    Times a model's prefill cost surface t(new, cached tokens) and its KV load/save rates on a device, or a
    running engine's through its API (--engine URL), and writes them to a portable JSON profile that
    `kvcli replay --prefill-profile FILE` prices savings with.

    Examples:

      kvcli profile --model llama-3-8b --device cuda --max-tokens 32768 --out profiles/llama-3-8b-h200-bf16.json

      kvcli profile --model tiny --device cpu --max-tokens 1024 --repeats 2 --out /tmp/tiny.json --json

      kvcli profile --model llama-3-8b --device cuda --kv-dtype fp8 --out profiles/llama-3-8b-h200-fp8kv.json

      kvcli profile --engine http://127.0.0.1:8000 --model ~/models/Llama-3.1-8B-Instruct --out profiles/vllm.json
    """
    from kvcli.model.load import model_context
    from kvcli.model.profile import check_max_tokens, check_repeats
    from kvcli.outfile import check_output
    from kvcli.replay.results import check_count
    from kvcli.store.serde import check_kv_dtype
    from kvcli.tables import stdout_console

    payload_dtype = check_kv_dtype(kv_dtype)
    check_repeats(repeats)
    for flag, count in (("--threads", threads), ("--warmup", warmup)):
        check_count(flag, count)
    if engine is None:
        context = model_context(model or "cpu")
        check_max_tokens(context if max_tokens is None else max_tokens, context)
    elif max_tokens is not None:
        check_max_tokens(max_tokens)  # the served model's context is checked once the engine answers
    check_output(out, "--out")
    if engine is not None:
        result = profile_engine(engine, model, served_model, dtype, device, max_tokens, repeats, warmup, threads,
                                payload_dtype)
    else:
        result = profile_local(model or "cpu", dtype, device, max_tokens, repeats, threads, payload_dtype)
    text = result.save(out)
    err.print(f"profile: written {out}", markup=False, highlight=False)
    if json_out:
        typer.echo(text)
    else:
        print_profile(result, stdout_console())


def profile_local(model: str, dtype: str | None, device: str, max_tokens: int | None, repeats: int, threads: int,
                  kv_dtype: str | None) -> Profile:
    """``kvcli profile`` of a local model (:func:`kvcli.model.profile.measure_profile`), progress on stderr."""
    from kvcli.model.load import load_model
    from kvcli.model.profile import device_facts, measure_profile, profile_points
    from kvcli.model.threads import torch_threads

    local = load_model(model, dtype, device)
    facts = device_facts(local.device)
    planned = len(profile_points(max_tokens or local.config.context))
    heads = {"prefill": f"timing {planned} points x {repeats} repeats on {facts['device']} ({facts['name']})",
             "kv": "load/save rates of 64, 256 and 1024-token chunks" + (" of fp8 payloads" if kv_dtype else "")}
    with torch_threads(threads), _Bar(heads) as bar:
        return measure_profile(local, max_tokens, repeats, bar.update, codec=store_codec(kv_dtype))


def profile_engine(url: str, model: str | None, served_model: str | None, dtype: str | None, device: str,
                   max_tokens: int | None, repeats: int, warmup: int, threads: int, kv_dtype: str | None) -> Profile:
    """``kvcli profile --engine URL``: the engine's TTFT surface (:func:`kvcli.model.engine_profile.
    measure_engine_profile`) and kvcli's KV payload path on ``device``, progress on stderr.

    Raises:
        BadInputError: a bad URL; no ``model`` and the served model is no folder here; as the measurement.
        EngineFailure: as :func:`~kvcli.model.engine_profile.measure_engine_profile`.
    """
    from kvcli.model.engine_client import EngineClient
    from kvcli.model.engine_profile import EngineRun, engine_max_tokens, measure_engine_profile, measure_payload_path
    from kvcli.model.load import model_shapes, resolve_spec
    from kvcli.model.profile import profile_points
    from kvcli.model.threads import torch_threads
    from kvcli.units import dtype_key

    with EngineClient(url) as client:
        info = client.info(served_model)
        model = model or _served_folder(info.served_model)
        spec, shapes = resolve_spec(model, dtype), model_shapes(model)
        run = EngineRun(shapes.vocab, max_tokens, repeats, warmup)
        planned = len(profile_points(engine_max_tokens(info, shapes, max_tokens)))
        engine = " ".join(x for x in (info.name, info.version) if x) or "the engine"
        heads = {"prefill": f"timing {planned} points x {repeats} repeats on {engine} at {info.url} "
                            f"({info.served_model}), after {warmup} warm-up rounds",
                 "kv": "kvcli's load/save rates of 64, 256 and 1024-token chunks" + (" of fp8 payloads" if kv_dtype
                                                                                     else "")}
        with torch_threads(threads), _Bar(heads) as bar:
            return measure_engine_profile(
                client, info, run, model=model, model_id=spec.model_id, dtype=dtype_key(spec.dtype), shapes=shapes,
                kv=lambda: measure_payload_path(shapes, dtype_key(spec.dtype), device, store_codec(kv_dtype), repeats,
                                                bar.update), progress=bar.update)


def _served_folder(served_model: str) -> str:
    """The served model's id as ``--model`` when it is a checkpoint folder here (vLLM serves a local folder under
    its path). Raises BadInputError otherwise: the profile needs the model's shapes."""
    if (Path(served_model).expanduser() / "config.json").is_file():
        return served_model
    raise BadInputError(f"--engine: give --model, the shapes of the served model {served_model} (a preset, or a "
                        "folder with its config.json)")


def store_codec(kv_dtype: str | None = None) -> KvCodec:
    """The store's payload path as a :class:`KvCodec` for payloads of ``kv_dtype`` (``--kv-dtype``: torch's name,
    :func:`kvcli.store.serde.check_kv_dtype`; None: the model's dtype): encode = :func:`kvcli.store.serde.encode_kv`
    (fp8: quantized with per-layer K and V scales) and :func:`kvcli.store.judge.payload_checksum`, as
    :func:`kvcli.store.chunkstore.chunk_payload`; decode = :func:`kvcli.store.judge.checked_tensor` (decode, shape,
    dtype and checksum; fp8 dequantized to the model's dtype)."""
    from kvcli.model.profile import KvCodec
    from kvcli.store.judge import checked_tensor, payload_checksum
    from kvcli.store.serde import dtype_name, encode_kv

    def encode(kv):
        value = encode_kv(kv, dtype=kv_dtype)
        return value, payload_checksum(value)

    def decode(value, checksum, shape, dtype):
        return checked_tensor(value, checksum, shape, dtype_name(kv_dtype or dtype), out_dtype=dtype)

    return KvCodec(encode, decode, kv_dtype)


def print_profile(result: Profile, console: Console) -> None:
    """stdout's view of a profile: the timed (and skipped) points, the fit, the KV rates; a heading line each."""
    from kvcli.tables import print_table

    facts = result.device
    points = Table()
    for name in ("kind", "new", "cached", "min s", "median s", "new tokens/s"):
        points.add_column(name, justify="left" if name == "kind" else "right")
    for p in result.points:
        fastest = min(p.seconds)
        points.add_row(p.kind, f"{p.new_tokens:,}", f"{p.cached_tokens:,}", f"{fastest:.4f}",
                       f"{statistics.median(p.seconds):.4f}", f"{p.new_tokens / fastest:,.0f}" if fastest else "–")
    for s in result.skipped:
        points.add_row(f"{s.kind}: skipped", f"{s.new_tokens:,}", f"{s.cached_tokens:,}", s.reason, "", "")
    curve = result.curve()
    fit = Table()
    for name in ("a s", "b s/token", "d s/pair", "e s/cached pair", "r2", "max rel error", "longest full"):
        fit.add_column(name, justify="right")
    fit.add_row(f"{curve.a:.3e}", f"{curve.b:.3e}", f"{curve.d:.3e}", f"{curve.e:.3e}", _num(curve.r2, ".4f"),
                _num(curve.max_rel_error, ".1%"), f"{result.longest_full_tokens:,}")
    kv = Table()
    for name in ("chunk tokens", "value bytes", "load min s", "save min s", "load GB/s", "save GB/s"):
        kv.add_column(name, justify="right")
    for t in result.kv_timings:
        load, save = min(t.load_seconds), min(t.save_seconds)
        kv.add_row(f"{t.chunk_tokens:,}", f"{t.value_bytes:,}", f"{load:.6f}", f"{save:.6f}",
                   _gbps(t.value_bytes / load if load else None, unit=False),
                   _gbps(t.value_bytes / save if save else None, unit=False))
    if result.engine is None:
        prefill = (f"prefill of {result.model_id} on {facts['device']} ({facts['name']}): {result.repeats} repeats, "
                   f"clock {result.clock}")
        payload = ""
    else:
        engine = " ".join(str(result.engine[k]) for k in ("name", "version") if result.engine.get(k)) or "engine"
        prefill = (f"time to first token of {result.engine['served_model']} ({result.model_id}) on {engine} at "
                   f"{result.engine['url']}: {result.repeats} repeats, wall clock at the client")
        payload = f" kvcli's, on {facts['device']} ({facts['name']}):"
    for heading, table in (
            (prefill, points),
            ("fit: t = a + b*n + d*n(n+1)/2 + e*n*c seconds (n new, c cached tokens)", fit),
            (f"KV payload:{payload} load {_gbps(result.load_bytes_per_second)}, save "
             f"{_gbps(result.save_bytes_per_second)} "
             f"(value bytes over the fastest repeat of the largest chunk); KV {result.kv_bytes_per_token:,} "
             f"bytes/token in {f'fp8 ({result.kv_dtype})' if result.kv_dtype else result.dtype}", kv)):
        console.print(heading, markup=False, highlight=False)
        print_table(console, table)


def _num(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _gbps(rate: float | None, unit: bool = True) -> str:
    return "–" if rate is None else f"{rate / 1e9:.2f}" + (" GB/s" if unit else "")


class _Bar:
    """Progress on stderr: a rich bar (timings done of planned, the current one) on a terminal; else one line per
    phase, from ``heads`` (phase -> what it does)."""

    def __init__(self, heads: dict[str, str]) -> None:
        self.heads, self.phase = heads, ""
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal)
        self.task: TaskID | None = None

    def __enter__(self) -> _Bar:
        self.bar.__enter__()
        return self

    def update(self, phase: str, done: int, total: int, what: str) -> None:
        """:data:`kvcli.model.profile.Progress`."""
        if phase != self.phase:
            self.phase = phase
            if self.bar.disable:
                err.print(f"profile: {self.heads.get(phase, phase)} ...", markup=False, highlight=False)
            else:
                self.task = self.bar.add_task(phase, total=total)
        if self.task is not None:
            self.bar.update(self.task, completed=done, total=total, description=f"{phase}: {what}")

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)
