"""docs/explain.md's agreement tables ("Agreement with vLLM", "Requests in flight"), made from the recorded vLLM
runs (tests/engine_sim/fixtures/, written by bench/engine_truth.py --record) and kvcli's predictions for them: no
vLLM needed, kvcli's Python only.

    PYTHONPATH=. python bench/engine_tables.py [--fixtures tests/engine_sim/fixtures]

Prints two Markdown tables and a line of totals above each:

1. one request at a time, a row per trace, block size and output length: each pool's ``num_gpu_blocks`` and the
   tokens vLLM cached (``N: tokens``), the requests kvcli explain ``--gpu-blocks N`` got exact, and those an LRU of
   the pool's ``N - 1`` blocks (``--capacity-tokens (N - 1) * B``, the prediction without the engine's accounting)
   got exact, over the runs with one output token;
2. all at once, a row per run: requests exact, the tokens (vLLM's; kvcli's where they differ), what kvcli predicts
   for the same output one request at a time and the gap (at once minus one at a time), the pinned hit tokens and
   the preemptions kvcli's engine model counts.

Exit 1 when any request is not exact (the table says where); a ``--fixtures`` folder without fixtures (``*.json``)
is an error, naming it, before any table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine_truth import ROOT, TOKENIZER, token_digest

from kvcli.analysis.explain import ExplainConfig, Explainer
from kvcli.analysis.workload import each_trace, ordered_requests
from kvcli.model.hf_tiny import build_tokenizer
from kvcli.sim.scheduler import EngineConfig


def requests_of(doc: dict, tokenizer_dir: str) -> list:
    """The fixture's requests as explain reads them (its first N where the fixture names ``first_requests``),
    checked against the fixture's token digest. Raises SystemExit where the trace's tokens changed."""
    (path, name, tok), = each_trace([ROOT / doc["trace"]], "auto", tokenizer_dir)
    requests, _ = ordered_requests(path, "auto", tok, name)
    requests = [r for r in requests if len(r.token_ids)][:doc.get("first_requests")]
    if token_digest([r.token_ids.tolist() for r in requests]) != doc["token_digest"]:
        raise SystemExit(f"{doc['trace']}: the token ids differ from those vLLM was given")
    return requests


def predict(requests: list, config: ExplainConfig) -> tuple[list[int], Explainer]:
    """Each request's reused tokens under ``config``, and the explainer (its ``result`` has the engine's counts)."""
    explainer = Explainer(config)
    return [explainer.add(r).reused_tokens for r in requests], explainer


def engine(run: dict, seqs: int | None = None) -> EngineConfig:
    return EngineConfig(run["gpu_blocks"], run["block_size"], seqs or run["max_num_seqs"],
                        run["max_num_batched_tokens"], at_once=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fixtures", type=Path, default=ROOT / "tests" / "engine_sim" / "fixtures")
    args = parser.parse_args()
    if not sorted(args.fixtures.glob("*.json")):
        raise SystemExit(f"{args.fixtures}: no fixture files (*.json) here: pass the folder bench/engine_truth.py "
                         f"--record wrote (default tests/engine_sim/fixtures)")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvcli-engine-tables-") as tmp:
        build_tokenizer(512).save_pretrained(tmp)
        docs = {p.stem: json.loads(p.read_text()) for p in sorted(args.fixtures.glob("*.json"))}
        one_rows, batch_rows = [], []
        totals = {"one": [0, 0, 0], "batch": [0, 0, 0]}  # requests, exact, runs
        for name, doc in docs.items():
            if doc["tokenizer"] != TOKENIZER:
                raise SystemExit(f"{doc['trace']}: recorded with another tokenizer")
            requests = requests_of(doc, tmp)
            groups: dict[tuple[int, int], list] = {}
            for run in doc["runs"]:
                cs, out = run["block_size"], run["output_tokens"]
                config = ExplainConfig(cs, engine=engine(run), output_tokens=out)
                predicted, explainer = predict(requests, config)
                exact = sum(a == b for a, b in zip(predicted, run["cached_tokens"]))
                kind = "one" if run["max_num_seqs"] == 1 else "batch"
                totals[kind][0] += len(requests)
                totals[kind][1] += exact
                totals[kind][2] += 1
                if kind == "one":
                    lru = None
                    if out == 1:
                        capped, _ = predict(requests, ExplainConfig(cs, capacity_chunks=run["gpu_blocks"] - 1))
                        lru = sum(a == b for a, b in zip(capped, run["cached_tokens"]))
                    groups.setdefault((cs, out), []).append((run, exact, lru))
                    continue
                alone, _ = predict(requests, ExplainConfig(cs, engine=engine(run, 1), output_tokens=out))
                vllm_tokens, kvcli_tokens = sum(run["cached_tokens"]), sum(predicted)
                tokens = f"{vllm_tokens:,}" + ("" if kvcli_tokens == vllm_tokens else f" (kvcli {kvcli_tokens:,})")
                batch_rows.append(
                    f"| {name} | {cs} | {run['gpu_blocks']:,} | {run['max_num_seqs']} | "
                    f"{run['max_num_batched_tokens']:,} | {out} | {exact:,} / {len(requests):,} | {tokens} | "
                    f"{sum(alone):,} | {vllm_tokens - sum(alone):+,} | {explainer.result.pinned_tokens:,} | "
                    f"{explainer.result.preemptions} |")
            for (cs, out), runs in sorted(groups.items()):
                runs.sort(key=lambda x: x[0]["gpu_blocks"])
                pools = " · ".join(f"{r['gpu_blocks']:,}: {sum(r['cached_tokens']):,}" for r, _, _ in runs)
                exact = sum(e for _, e, _ in runs)
                lrus = [lru for _, _, lru in runs if lru is not None]
                lru_cell = f"{sum(lrus):,} / {len(lrus) * len(requests):,}" if lrus else "–"
                one_rows.append(f"| {name} ({len(requests):,}) | {cs} | {out} | {pools} | "
                                f"{exact:,} / {len(runs) * len(requests):,} | {lru_cell} |")
        requests, exact, runs = totals["one"]
        print(f"One request at a time: {requests:,} requests in {runs} runs, {exact:,} exact.\n")
        print("| trace (requests) | block | output tokens | num_gpu_blocks: vLLM's cached tokens | requests exact | "
              "LRU of N − 1 blocks: exact |\n|---|---|---|---|---|---|")
        print("\n".join(one_rows))
        requests, exact, runs = totals["batch"]
        print(f"\nAll at once: {requests:,} requests in {runs} runs, {exact:,} exact.\n")
        print("| trace | block | num_gpu_blocks | max_num_seqs | batched | output | exact | vLLM tokens | "
              "kvcli one at a time | gap | pinned hit tokens | preemptions |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(batch_rows))
        return 0 if all(t[0] == t[1] for t in totals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
