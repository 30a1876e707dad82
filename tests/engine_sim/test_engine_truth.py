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


#: the sample traces where one request reuses blocks of a request before the one just before it, so that a bounded
#: pool can evict them; in the others nothing is reused (no_reuse, sharegpt_single_turn, tokens_small at blocks of 32
#: and 64) or each request reuses what the request just before it left, whose blocks are freed last and so evicted
#: last, and are pinned before the request takes a block (docs/explain.md, "Agreement with vLLM").
EVICTABLE = {"chat_shared_system", "bailian_handmade", "glaive_toolcall_head30", "dynamo_exgentic_handmade",
             "ragpulse_head60", "aiperf_agentic_code_3x5", "mooncake_conversation_head1000"}

#: sample traces with no recorded engine runs (every sample trace has them: a trace added to sample_traces/ fails
#: the coverage test below until bench/engine_truth.py records it, or it is named here with the reason)
NOT_RECORDED: set[str] = set()

#: (trace, block size) recorded without the bounded runs: tokens_small's prompts reuse nothing (vLLM cached 0 tokens
#: of them in every run), so a bounded pool has nothing to evict there
NO_BOUNDED_RUN = {("sample_traces/tokens_small.jsonl", 32)}


def _requests(trace: Path, tokenizer: str, first: int | None = None) -> list:
    (path, name, tok), = each_trace([trace], "auto", tokenizer)
    requests, _ = ordered_requests(path, "auto", tok, name)
    return [r for r in requests if len(r.token_ids)][:first]


def _unbounded(doc: dict, run: dict) -> bool:
    """Whether the run's pool holds every token of the trace: its ``N - 1`` blocks hold each request's blocks."""
    bs, out = run["block_size"], run["output_tokens"]
    return (run["gpu_blocks"] - 1) >= sum(-(-(p + out - 1) // bs) for p in doc["prompt_tokens"])


def test_there_are_recorded_runs_of_every_kind():
    runs = [run for path in RECORDED for run in json.loads(path.read_text())["runs"]]
    kinds = {(run["block_size"], run["max_num_seqs"] > 1, run["output_tokens"] > 1) for run in runs}
    assert {(32, False, False), (32, True, True), (64, False, False), (64, True, True), (32, False, True)} <= kinds
    assert len(RECORDED) >= 11 and len(runs) >= 100


def test_every_sample_trace_runs_at_32_and_64_bounded_and_not_and_at_once_bounded():
    docs = [json.loads(path.read_text()) for path in RECORDED]
    samples = {f"sample_traces/{p.name}" for p in (REPO / "sample_traces").iterdir() if p.suffix not in (".py", ".md")}
    assert {doc["trace"] for doc in docs} == samples - NOT_RECORDED
    for doc in docs:
        kinds = {(run["block_size"], run["arrivals"], _unbounded(doc, run)) for run in doc["runs"]}
        for bs in (32, 64):
            wanted = {(bs, "one at a time", True), (bs, "one at a time", False), (bs, "at once", False)}
            if (doc["trace"], bs) in NO_BOUNDED_RUN:
                wanted = {(bs, "one at a time", True)}
            assert wanted <= kinds, (doc["trace"], bs)


@pytest.mark.parametrize("name", sorted(EVICTABLE))
def test_a_bounded_pool_evicts_some_reuse_one_request_at_a_time(name):
    # the engine's own figures: at each block size some bounded run reused fewer tokens than the unbounded one
    doc = json.loads((FIXTURES / f"{name}.json").read_text())
    for bs in (32, 64):
        one = [r for r in doc["runs"] if r["block_size"] == bs and r["max_num_seqs"] == 1 and r["output_tokens"] == 1]
        (unbounded,) = [sum(r["cached_tokens"]) for r in one if _unbounded(doc, r)]
        assert min(sum(r["cached_tokens"]) for r in one if not _unbounded(doc, r)) < unbounded, bs


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_kvcli_predicts_what_vllm_reused_request_by_request(path, tokenizer_dir):
    doc = json.loads(path.read_text())
    assert doc["tokenizer"] == TOKENIZER
    requests = _requests(REPO / doc["trace"], tokenizer_dir, doc.get("first_requests"))  # a cut: its first N
    assert [len(r.token_ids) for r in requests] == doc["prompt_tokens"]
    assert token_digest([r.token_ids.tolist() for r in requests]) == doc["token_digest"], "the trace's tokens changed"
    for run in doc["runs"]:
        engine = EngineConfig(run["gpu_blocks"], run["block_size"], run["max_num_seqs"],
                              run["max_num_batched_tokens"], at_once=True)
        explainer = Explainer(ExplainConfig(run["block_size"], engine=engine, output_tokens=run["output_tokens"]))
        predicted = [explainer.add(r).reused_tokens for r in requests]
        assert predicted == run["cached_tokens"], {k: v for k, v in run.items() if k != "cached_tokens"}


def test_engine_tables_refuses_a_folder_without_fixtures(tmp_path, monkeypatch):
    """bench/engine_tables.py given a folder with no recorded runs says so, naming it (exit 1), not two empty tables
    and exit 0."""
    import engine_tables  # bench/engine_tables.py

    for folder in (tmp_path, tmp_path / "missing"):
        monkeypatch.setattr("sys.argv", ["engine_tables.py", "--fixtures", str(folder)])
        with pytest.raises(SystemExit) as info:
            engine_tables.main()
        assert info.value.code == (f"{folder}: no fixture files (*.json) here: pass the folder bench/engine_truth.py "
                                   "--record wrote (default tests/engine_sim/fixtures)")
