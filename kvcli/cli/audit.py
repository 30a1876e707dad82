"""``kvcli audit``: what an engine cached beside what explain predicts, each token of difference given a cause."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvcli.cli.options import JsonOut


def audit(
    trace: Annotated[Path, typer.Argument(help="The trace the engine served (any format explain reads).")],
    engine_log: Annotated[Path, typer.Option(help="The engine's per-request report, JSONL: vLLM RequestOutput rows "
                                                  "(request_id, num_cached_tokens), OpenAI responses "
                                                  "(usage.prompt_tokens_details.cached_tokens) or gateway rows "
                                                  "holding one.")],
    block_size: Annotated[int, typer.Option(help="The engine's tokens per KV block (vLLM's --block-size).")],
    events: Annotated[Optional[Path], typer.Option(help="The engine's KV events (kvcli events record's file): "
                                                        "what its cache held when each request arrived.")] = None,
    gpu_blocks: Annotated[Optional[int], typer.Option(help="The engine's KV blocks (vLLM's num_gpu_blocks, null "
                                                           "block included); explain's capacity is (N - 2) * "
                                                           "block size. Default: unbounded.")] = None,
    top: Annotated[int, typer.Option(help="Causes listed.")] = 5,
    json_out: JsonOut = False,
) -> None:
    """An engine's cached tokens per request, beside explain's.

    Per request, the prompt tokens the engine reported cached beside explain's prediction at the engine's block
    size and capacity, and a cause for every token of difference: the whole last block vLLM recomputes, a prompt
    the engine counted differently, and with --events blocks evicted by the engine (by which requests), never
    stored, not yet stored, or held under another salt. What no cause covers is unexplained.

    Examples:

      kvcli audit trace.jsonl --engine-log requests.jsonl --block-size 16

      kvcli audit trace.jsonl --engine-log outputs.jsonl --events events.jsonl --block-size 32 --gpu-blocks 100 --json
    """
    from kvcli.analysis.audit import audit_body, audit_trace
    from kvcli.errors import BadInputError
    from kvcli.units import json_document

    if block_size < 1:
        raise BadInputError(f"--block-size must be >= 1, got {block_size}")
    body = audit_body(audit_trace(trace, engine_log, block_size, gpu_blocks, events), block_size, gpu_blocks, top)
    if json_out:
        typer.echo(json_document("audit", body, indent=1))
        return
    t = body["traces"][0]
    typer.echo(f"{t['name']}: {t['requests_exact']} / {t['requests']} requests exact (joined by {t['joined_by']}); "
               f"engine cached {t['engine_cached_tokens']:,} tokens, predicted {t['predicted_cached_tokens']:,}, "
               f"unexplained {t['unexplained_tokens']:,}")
    for c in t["top_causes"]:
        typer.echo(f"  {c['cause']:<20} {c['tokens']:+,} tokens")
    for r in t["per_request"]:
        if r["difference_tokens"] or r["unexplained_tokens"]:
            causes = ", ".join(f"{c} {v:+,}" for c, v in r["causes"].items())
            by = f" (evicted by {', '.join(r['evicted_by'])})" if r["evicted_by"] else ""
            typer.echo(f"  {r['id']}: engine {r['engine_cached_tokens']:,}, predicted {r['predicted_cached_tokens']:,}"
                       f": {causes or 'no cause'}{by}"
                       + (f", unexplained {r['unexplained_tokens']:+,}" if r["unexplained_tokens"] else ""))
