"""kvcli explain --gpu-blocks against figures recorded from a real vLLM engine (tests/engine_sim/fixtures/, written
by bench/engine_truth.py; vLLM itself is not needed here): for every recorded run, one request at a time or all at
once, each request's predicted reused tokens equal the engine's ``num_cached_tokens`` exactly."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_truth import TOKENIZER, token_digest  # bench/engine_truth.py (tests/conftest.py puts bench/ on the path)

from kvcli.analysis.explain import ExplainConfig, Explainer
from kvcli.analysis.workload import each_trace, ordered_requests
from kvcli.sim.scheduler import EngineConfig

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]
RECORDED = sorted(FIXTURES.glob("*.json"))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    """The tiny checkpoint's tokenizer (the model's weights play no part in which tokens are cached)."""
    from kvcli.model.hf_tiny import build_tokenizer

    folder = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tokenizer(512).save_pretrained(folder)
    return str(folder)


def _requests(trace: Path, tokenizer: str) -> list:
    (path, name, tok), = each_trace([trace], "auto", tokenizer)
    requests, _ = ordered_requests(path, "auto", tok, name)
    return [r for r in requests if len(r.token_ids)]


def test_there_are_recorded_runs_of_every_kind():
    runs = [run for path in RECORDED for run in json.loads(path.read_text())["runs"]]
    kinds = {(run["block_size"], run["max_num_seqs"] > 1, run["output_tokens"] > 1) for run in runs}
    assert {(32, False, False), (32, True, True), (64, False, False), (64, True, True), (32, False, True)} <= kinds
    assert len(RECORDED) >= 5 and len(runs) >= 40


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_kvcli_predicts_what_vllm_reused_request_by_request(path, tokenizer_dir):
    doc = json.loads(path.read_text())
    assert doc["tokenizer"] == TOKENIZER
    requests = _requests(REPO / doc["trace"], tokenizer_dir)
    assert [len(r.token_ids) for r in requests] == doc["prompt_tokens"]
    assert token_digest([r.token_ids.tolist() for r in requests]) == doc["token_digest"], "the trace's tokens changed"
    for run in doc["runs"]:
        engine = EngineConfig(run["gpu_blocks"], run["block_size"], run["max_num_seqs"],
                              run["max_num_batched_tokens"], at_once=True)
        explainer = Explainer(ExplainConfig(run["block_size"], engine=engine, output_tokens=run["output_tokens"]))
        predicted = [explainer.add(r).reused_tokens for r in requests]
        assert predicted == run["cached_tokens"], {k: v for k, v in run.items() if k != "cached_tokens"}
