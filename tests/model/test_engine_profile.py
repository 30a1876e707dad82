"""kvcli.model.engine_profile, kvcli.model.engine_client and ``kvcli profile --engine``, against a loopback server
that replays vLLM 0.32.0's recorded answers (tests/model/fixtures/vllm/README.md): the profile's structure, the
cached tokens the engine confirmed, the requests kvcli sent, a replay priced with the profile, and each failure's
one line and exit code. Timings vary: no timing is asserted."""
from __future__ import annotations

import collections
import http.server
import json
import socket
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.cli.profile import store_codec
from kvcli.errors import BadInputError, EngineFailure
from kvcli.model.calibration import BASE_POINTS
from kvcli.model.engine_client import Completion, EngineClient, EngineInfo, public_url
from kvcli.model.engine_profile import EngineRun, engine_max_tokens, measure_engine_profile, measure_payload_path
from kvcli.model.load import model_shapes
from kvcli.model.profile import FORMAT, Profile

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
MODEL = str(FIXTURES / "model")  # the served checkpoint's config.json: its shapes
SERVED = "/tmp/ep/tiny-llama-256"
ROOT = Path(__file__).resolve().parents[2]


class RecordedEngine:
    """A loopback HTTP server answering as the engine did in one recorded session: each GET with its recorded body,
    each ``POST /v1/completions`` with the next recorded answer for a prompt of that many token ids (kvcli sends
    its requests in a fixed order), anything else 404. ``prompts`` keeps the token ids received, in order."""

    def __init__(self, session: str | None) -> None:
        records = [json.loads(line) for line in (FIXTURES / session).read_text().splitlines()] if session else []
        self.gets = {r["path"]: r for r in records if r["method"] == "GET"}
        self.recorded_gets = dict(self.gets)
        self.posts: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        for r in records:
            if r["method"] == "POST":
                self.posts[r["prompt_tokens"]].append(r)
        self.prompts: list[list[int]] = []
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(engine.gets.get(self.path))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                engine.prompts.append(body["prompt"])
                queue = engine.posts.get(len(body["prompt"])) if self.path == "/v1/completions" else None
                self._answer(queue.popleft() if queue else None)

            def _answer(self, record) -> None:
                status, kind, text = ((record["status"], record["content_type"], record["body"]) if record
                                      else (404, "application/json", '{"detail":"Not Found"}'))
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def left(self) -> int:
        """Recorded completions not asked for."""
        return sum(len(q) for q in self.posts.values())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine(request):
    server = RecordedEngine(getattr(request, "param", "profile.jsonl"))
    yield server
    server.close()


def _profile(url: str, out: Path, *args: str):
    return CliRunner().invoke(app, ["profile", "--engine", url, "--model", MODEL, "--max-tokens", "1024",
                                    "--repeats", "2", "--device", "cpu", "--out", str(out), *args])


def _error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("kvcli: error: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture
def measured(engine, tmp_path):
    out = tmp_path / "engine.json"
    result = _profile(engine.url, out, "--json")
    assert result.exit_code == 0, result.output
    return engine, out, json.loads(result.stdout)


def test_the_profile_says_what_the_engine_is_and_what_it_confirmed(measured):
    engine, out, doc = measured
    profile = Profile.load(out)
    assert doc["format"] == FORMAT and doc["engine"] == {
        "url": engine.url, "name": "vllm", "version": "0.32.0", "served_model": SERVED, "max_model_len": 8192,
        "block_size": 32, "prefix_caching": True, "kv_cache_dtype": "auto",
        "timed": "time to first token of a streamed completion (max_tokens 1), wall clock at the client",
        "warmup_rounds": 2}
    # the base grid up to 1,024 tokens, each hit at the cached tokens vLLM reported (whole 32-token blocks)
    assert [(p.kind, p.new_tokens, p.cached_tokens) for p in profile.points] == [("base", n, c) for n, c in BASE_POINTS]
    assert profile.skipped == () and all(len(p.seconds) == 2 and min(p.seconds) > 0 for p in profile.points)
    assert (profile.model, profile.dtype, profile.shapes, profile.clock) == (
        MODEL, "bfloat16", model_shapes(MODEL), "perf_counter")
    assert (profile.max_tokens, profile.repeats, profile.max_past_bytes) == (1024, 2, 960 * 1024)
    assert profile.device["type"] == "cpu" and profile.load_bytes_per_second and profile.save_bytes_per_second
    assert profile.curve().to_dict() == profile.fit and profile.engine == doc["engine"]
    assert engine.left() == 0  # every recorded answer was asked for, in order


def test_each_hit_is_the_prefix_just_sent_and_every_prompt_is_new(measured):
    engine, _, _ = measured
    prompts = engine.prompts
    # 2 warm-up rounds (a 512-token prefix, then it + 64), then per round each point: its prefix (when it has
    # one) and the timed prompt
    assert [len(p) for p in prompts[:4]] == [512, 576, 512, 576]
    per_round = [n for n, c in BASE_POINTS for n in ((c, n + c) if c else (n,))]
    assert [len(p) for p in prompts[4:]] == per_round * 2
    for prefix, hit in zip(prompts, prompts[1:]):
        if len(hit) > len(prefix) and len(prefix) in (256, 512, 960) and hit[:len(prefix)] == prefix:
            assert hit[len(prefix):] != prefix[:len(hit) - len(prefix)]
    timed = [p for p in prompts[4:] if len(p) in {n + c for n, c in BASE_POINTS}]
    assert len({tuple(p[:32]) for p in timed}) >= len(BASE_POINTS)  # full prefills start differently
    # each timed hit starts with the prefix sent just before it; the suffix is new at every repeat
    hits = [(a, b) for a, b in zip(prompts[4:], prompts[5:]) if len(a) in (256, 512, 960) and b[:len(a)] == a
            and len(b) > len(a)]
    assert sorted(len(a) for a, _ in hits) == [256, 256, 512, 512, 960, 960]
    for size in (256, 512, 960):
        first, second = [b for a, b in hits if len(a) == size]
        assert first[:size] == second[:size] and first[size:] != second[size:]


def _replay_priced_with(profile: Path, redis_url: str, *args: str) -> dict:
    """The chat sample replayed at chunk size 64 with ``--prefill-profile profile``: its JSON report."""
    trace = ROOT / "sample_traces" / "chat_shared_system.jsonl"
    result = CliRunner().invoke(app, ["replay", str(trace), "--model", MODEL, "--prefill-profile", str(profile),
                                      "--payload", "accounted", "--chunk-sizes", "64", "--redis-url", redis_url,
                                      "--json", "--jobs", "1", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_replay_prices_with_the_engine_profile(measured, tmp_path, redis_url):
    engine, out, doc = measured
    report = _replay_priced_with(out, redis_url, "--measure", "0")
    context = report["context"]
    assert context["cost_curve_source"] == (f"profile: {out} (times to first token of vllm 0.32.0 at {engine.url}, "
                                            f"measured)")
    assert context["cost_curve"] == doc["fit"]
    assert context["device_rates"]["load_bytes_per_second"] == doc["kv_rates"]["load_bytes_per_second"]
    assert report["traces"][0]["measured_requests"] == 0
    (chunk,) = report["traces"][0]["per_chunk_size"]
    assert chunk["hit_tokens"] > 0  # priced with the fit of the recorded engine's loopback replays: any sign


def test_the_engine_profile_is_preferred_over_the_mfu_of_an_accelerator_also_named(measured, tmp_path, redis_url):
    """--prefill-profile with --hardware: the profile's measured fit prices every prefill (no roofline, no MFU),
    its KV rates move KV, the accelerator sizes only the GPU tier; the report says which priced what."""
    engine, out, doc = measured
    report = _replay_priced_with(out, redis_url, "--hardware", "h100-sxm")
    context, (trace_doc,) = report["context"], report["traces"]
    source = (f"profile: {out} (times to first token of vllm 0.32.0 at {engine.url}, measured); preferred over "
              f"--hardware h100-sxm's MFU (that accelerator sizes the GPU tier only)")
    assert context["cost_curve_source"] == source == trace_doc["pricing"]["prefill"]
    assert context["cost_curve"] == doc["fit"] and "mfu" not in context["cost_curve"]
    assert context["device_rates"]["load_bytes_per_second"] == doc["kv_rates"]["load_bytes_per_second"]
    assert trace_doc["measured_requests"] == 0  # --measure auto: 0, prefill priced
    assert trace_doc["capacity"]["why"] == "the per-node GPU tier of --hardware h100-sxm"
    assert trace_doc["answer"]["pricing"]["kind"] == "profile"


@pytest.mark.parametrize("engine, message", [
    ("no_prefix_caching.jsonl", "reported 0 cached tokens for a 512-token prefix it had just been sent: prefix "
                                "caching is off (its /metrics says enable_prefix_caching False); start it with "
                                "prefix caching (vLLM: --enable-prefix-caching)"),
    ("no_prompt_details.jsonl", "reports no prompt_tokens_details.cached_tokens in its usage, which confirms each "
                                "cache hit (vLLM: --enable-prompt-tokens-details)"),
    (None, "is not an OpenAI-compatible engine: GET /v1/models answered 404"),
], indirect=["engine"])
def test_an_engine_that_cannot_confirm_hits_fails_in_one_line(engine, message, tmp_path):
    result = _profile(engine.url, tmp_path / "p.json")
    assert result.exit_code == 4 and _error(result).endswith(message), result.output
    assert not (tmp_path / "p.json").exists()


def test_an_unreachable_engine_fails_in_one_line_without_its_credentials(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    result = _profile(f"http://user:s3cret@127.0.0.1:{port}/v1", tmp_path / "p.json")
    assert result.exit_code == 4 and _error(result).startswith(
        f"kvcli: error: cannot reach the engine at http://127.0.0.1:{port} ")
    assert "s3cret" not in result.output


@pytest.mark.parametrize("args, message", [
    (["--served-model", "other"], f"--served-model other: the engine at {{url}} serves {SERVED}"),
    (["--max-tokens", "8192"], "--max-tokens 8,192: the engine serves 8,192 tokens (max_model_len), prompts of at "
                               "most 8,191 with the one generated"),
])
def test_options_the_engine_cannot_serve_are_refused(engine, tmp_path, args, message):
    result = CliRunner().invoke(app, ["profile", "--engine", engine.url, "--model", MODEL, "--device", "cpu",
                                      "--out", str(tmp_path / "p.json"), *args])
    assert result.exit_code == 2 and _error(result).endswith(message.format(url=engine.url)), result.output
    assert engine.prompts == []  # refused before any completion


def _serving(engine: RecordedEngine, served: str) -> None:
    """The recorded engine, answering GET /v1/models with ``served`` as the served model's id."""
    models = engine.recorded_gets["/v1/models"]
    engine.gets["/v1/models"] = models | {"body": models["body"].replace(f'"{SERVED}"', json.dumps(served))}


def test_without_model_the_served_model_must_be_a_folder_here(engine, tmp_path):
    _serving(engine, "meta-llama/Llama-3.1-8B-Instruct")  # a hub name, as most engines serve
    result = CliRunner().invoke(app, ["profile", "--engine", engine.url, "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and _error(result).endswith(
        "--engine: give --model, the shapes of the served model meta-llama/Llama-3.1-8B-Instruct (a preset, or a "
        "folder with its config.json)"), result.output
    _serving(engine, MODEL)  # a folder here: its config gives the shapes
    result = CliRunner().invoke(app, ["profile", "--engine", engine.url, "--max-tokens", "1024", "--repeats", "2",
                                      "--device", "cpu", "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 0 and Profile.load(tmp_path / "p.json").model == MODEL, result.output


def test_the_credentials_stay_out_of_the_profile(engine, tmp_path):
    host = engine.url.removeprefix("http://")
    out = tmp_path / "p.json"
    result = _profile(f"http://user:s3cret@{host}/v1/", out)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["engine"]["url"] == engine.url and "s3cret" not in out.read_text()


@pytest.mark.parametrize("url, public", [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
    ("https://key@[::1]:8443/engine/v1?x=1#f", "https://[::1]:8443/engine"),
    ("http://user:pw@localhost/", "http://localhost"),
])
def test_public_url(url, public):
    assert public_url(url) == public


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://127.0.0.1", "http://", "http://127.0.0.1:99999"])
def test_a_url_that_is_not_http_is_refused(url):
    with pytest.raises(BadInputError, match="--engine"):
        EngineClient(url)


def _info(block_size: int | None, max_model_len: int | None = 8192) -> EngineInfo:
    return EngineInfo("http://127.0.0.1:1", "vllm", "0.32.0", "m", max_model_len, block_size, True, "auto")


@pytest.mark.parametrize("max_model_len, asked, longest", [
    (8192, None, 8191), (None, None, 8192), (4096, 2048, 2048), (100000, None, 8192)])
def test_the_longest_point_fits_the_engine_and_the_shapes(max_model_len, asked, longest):
    assert engine_max_tokens(_info(32, max_model_len), model_shapes("tiny"), asked) == longest


def test_engine_run_refuses_counts_below_one():
    with pytest.raises(BadInputError, match="--warmup must be a whole number >= 1, got 0"):
        EngineRun(100, warmup=0)


class _Emulated:
    """An engine client that counts cached tokens as vLLM does: the longest prefix shared with a prompt sent
    before, at most all but the last token, floored to ``block`` tokens; ``adjust(prompt length, that count)``
    gives what it reports instead. Every TTFT is 0.01 s."""

    def __init__(self, block: int, adjust=None) -> None:
        self.block, self.adjust, self.seen = block, adjust or (lambda length, cached: cached), []

    def complete(self, served_model, token_ids):
        from itertools import takewhile

        shared = max((sum(1 for _ in takewhile(lambda ab: ab[0] == ab[1], zip(s, token_ids))) for s in self.seen),
                     default=0)
        self.seen.append(list(token_ids))
        cached = min(shared, len(token_ids) - 1) // self.block * self.block
        return Completion(0.01, len(token_ids), self.adjust(len(token_ids), cached))


def _run(client, block_size: int | None = 32):
    shapes = model_shapes("tiny")
    return measure_engine_profile(
        client, _info(block_size), EngineRun(shapes.vocab, 1024, repeats=2, warmup=1), model="tiny",
        model_id="kvcli/tiny@seed0:fp32", dtype="float32", shapes=shapes,
        kv=lambda: measure_payload_path(shapes, "float32", "cpu", store_codec(), 1))


def test_an_engine_counting_as_vllm_confirms_every_point():
    profile = _run(_Emulated(32))
    assert [(p.new_tokens, p.cached_tokens) for p in profile.points] == list(BASE_POINTS) and not profile.skipped


def test_a_point_whose_count_differs_is_skipped_with_what_the_engine_said():
    repeats = collections.Counter()

    def adjust(length, cached):
        repeats[length, cached] += 1
        if (length, cached) == (1024, 960):  # 64 after 960: one block short at the second repeat
            return 928 if repeats[length, cached] == 2 else 960
        return 0 if (length, cached) in ((512, 256), (1024, 512)) else cached  # the (256, 256), (512, 512) hits

    profile = _run(_Emulated(32, adjust))
    assert [(s.new_tokens, s.cached_tokens) for s in profile.skipped] == [(256, 256), (512, 512), (64, 960)]
    assert [s.reason for s in profile.skipped] == [
        "the engine reported 0 cached tokens of a 256-token prefix, expected 256 (the prefix floored to its "
        "32-token blocks)",
        "the engine reported 0 cached tokens of a 512-token prefix, expected 512 (the prefix floored to its "
        "32-token blocks)",
        "the engine reported 928 and 960 cached tokens of a 960-token prefix, expected 960 (the prefix floored to "
        "its 32-token blocks)"]
    assert [(p.new_tokens, p.cached_tokens) for p in profile.points] == [(32, 0), (128, 0), (512, 0), (1024, 0)]


def test_without_a_block_size_a_hit_within_the_prefix_counts_as_reported():
    profile = _run(_Emulated(128), block_size=None)  # 960 cached tokens are 896 in 128-token blocks
    assert [(p.new_tokens, p.cached_tokens) for p in profile.points] == [
        (32, 0), (128, 0), (512, 0), (1024, 0), (256, 256), (512, 512), (128, 896)]


def test_no_confirmed_point_is_an_engine_failure():
    with pytest.raises(EngineFailure, match=r"^no point could be confirmed on the engine at http://127.0.0.1:1: the "
                                            r"engine reported 5 cached tokens of a 0-token prefix, expected 0 \(a "
                                            r"prompt never sent before\)$"):
        _run(_Emulated(32, lambda length, cached: 5))
