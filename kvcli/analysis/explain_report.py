"""``kvcli explain``'s output: the JSON body and the rich tables of explained traces
(:class:`~kvcli.analysis.workload.ExplainedTrace`), and one request's chunk map beside its predecessor's."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvcli.analysis.explain import CAUSES, TOKEN_ORDER, BlockHashes, Explanation, TraceExplanation
from kvcli.analysis.workload import ExplainedTrace
from kvcli.tables import print_table

#: what each cause means, for the tables' captions and the JSON document.
CAUSE_HELP = {
    "reused": "tokens the chunk-hash cache reused",
    "chunk_boundary": "shared with an earlier prompt, but inside the partial chunk where the shared prefix ends",
    "hybrid_block": ("held at the chunk size, but a vLLM engine serving the hybrid model resumes only at its "
                     "enlarged attention block's boundaries where an earlier request left a Mamba state"),
    "eviction": "held by an unlimited cache, evicted by the capacity (the LRU, or the engine's block pool)",
    "expiry": "held at the capacity, expired by the TTL",
    "last_token": "the whole prompt was cached: the engine computes its last token again",
    "cache_salt": "shared only with requests of another cache salt or served model (a LoRA adapter or the base)",
    "divergence": "after the first token where the prompt differs from its best predecessor",
    "new": "past the end of every earlier prompt it shares a prefix with (no cache could hold them)",
}
#: requests listed per trace as those that lost the most reusable tokens (every cause but "new").
WORST_REQUESTS = 5


def to_body(traces: list[ExplainedTrace], top: int, request_id: str | None = None,
            block_hashes: BlockHashes | None = None) -> dict:
    """The JSON body (for :func:`kvcli.units.json_document`): the causes' meanings and one object per trace, each
    with its totals, top divergence sites and every request; with ``request_id``, that request's chunk map too."""
    return {"causes": CAUSE_HELP, "traces": [_trace_json(t, top, request_id, block_hashes) for t in traces]}


def _trace_json(t: ExplainedTrace, top: int, request_id: str | None, block_hashes: BlockHashes | None) -> dict:
    x = t.explanation
    cfg = x.config
    ids = [e.id for e in x.explained]
    body = {
        "trace": t.name, "format": t.fmt, "notes": t.notes, "chunk_size": cfg.chunk_size,
        "capacity_chunks": cfg.capacity_chunks, "ttl_seconds": cfg.ttl, "ttl_refresh": cfg.ttl_refresh,
        "engine": _engine_json(x),
        "requests": x.requests, "prompt_tokens": x.prompt_tokens, "reused_tokens": x.reused_tokens,
        "upper_bound_tokens": x.upper_bound_tokens, "reused_from_namespace_tokens": x.reused_from_namespace_tokens,
        "lost_tokens_by_cause": x.lost_tokens_by_cause,
        "reordered_requests": x.reordered, "models": x.models,
        "top_divergence_sites": [{"site": s.label, "requests": s.requests, "divergence_tokens": s.tokens,
                                  "message_index": s.example.message_index if s.example else None,
                                  "role": s.example.role if s.example else None,
                                  "field": s.example.field if s.example else None,
                                  "example_request": s.example_request,
                                  "example_ours": s.example.ours if s.example else None,
                                  "example_predecessor": s.example.theirs if s.example else None}
                                 for s in x.top_sites(top)],
        "per_request": [_request_json(e, ids) for e in x.explained],
    }
    if request_id is not None and t.tokens:
        e = x.request(request_id)
        body["request"] = {**_request_json(e, ids), "chunks": chunk_map(t, e, block_hashes),
                           **({"block_hashes": block_hashes.described} if block_hashes is not None else {})}
    return body


def _engine_json(x: TraceExplanation) -> dict | None:
    """The engine of ``--gpu-blocks`` (None without one): its settings, the output length, its preemptions and the
    reused tokens that came from blocks a running request held."""
    engine = x.config.engine
    if engine is None:
        return None
    out = x.config.output_tokens
    return {"num_gpu_blocks": engine.num_gpu_blocks, "block_size": engine.block_size,
            "max_num_seqs": engine.max_num_seqs, "max_num_batched_tokens": engine.max_num_batched_tokens,
            "step_seconds": engine.step_seconds, "prefill_tokens_per_second": engine.prefill_tokens_per_second,
            "at_once": engine.at_once, "output_tokens": "trace" if out is None else out,
            "preemptions": x.preemptions, "pinned_hit_tokens": x.pinned_tokens}


def _cache_label(x: TraceExplanation) -> str:
    """The cache a trace was explained at, in words: chunk size and capacity (or TTL), or the engine."""
    cfg, engine = x.config, x.config.engine
    if engine is not None:
        out = cfg.output_tokens
        flight = ("one request at a time" if engine.max_num_seqs == 1 else
                  f"{engine.max_num_seqs} requests at once, {engine.max_num_batched_tokens:,} tokens a step, "
                  + ("arriving together" if engine.at_once else "at their timestamps"))
        return (f"vLLM engine of {engine.num_gpu_blocks:,} GPU blocks of {engine.block_size} tokens, {flight}, "
                + ("output lengths of the trace" if out is None else f"{out} output token{'s' * (out != 1)} each"))
    return (f"chunk {cfg.chunk_size}, " + (f"capacity {cfg.capacity_chunks:,} chunks" if cfg.capacity_chunks
                                             is not None else "unlimited capacity")
            + (f", TTL {cfg.ttl:g} s {'from last access' if cfg.ttl_refresh else 'from write'}"
               if cfg.ttl is not None else ""))


def _request_json(e: Explanation, ids: list[str]) -> dict:
    site = e.site
    return {"id": e.id, "source": e.source, "cache_salt": e.cache_salt, "model": e.model,
            "prompt_tokens": e.prompt_tokens,
            "reused_tokens": e.reused_tokens, "reused_from_namespace_tokens": e.reused_from_namespace_tokens,
            "upper_bound_tokens": e.upper_bound_tokens,
            "best_prefix_tokens": e.best_prefix_tokens,
            "best_prefix_tokens_any_salt": e.best_prefix_tokens_any_salt,
            "predecessor": ids[e.predecessor] if e.predecessor >= 0 else None,
            "first_divergent_token": e.first_divergent_token, "lost_tokens_by_cause": e.lost_tokens_by_cause,
            "divergence_site": site.label if site else None,
            "divergence_ours": site.ours if site else None, "divergence_predecessor": site.theirs if site else None,
            "timestamp_seconds": e.timestamp, "token_spans": [list(span) for span in spans(e)]}


def explain_notes(traces: list[ExplainedTrace], request_id: str | None, scheme: str, hash_seed: str | None,
                  namespace: str | None) -> list[str]:
    """What the user should know about how the options were taken, one line each (stderr): options that change
    nothing here, an id that names several requests, a namespace that added nothing, engine hashes over tokens no
    engine saw (a hash-id trace's, synthesized)."""
    from kvcli.traces.hashids import HASH_ID_FORMATS

    notes = []
    if scheme != "kvcli" and request_id is None:
        notes.append(f"--hash {scheme} names the chunks of --request's chunk map: without --request it changes "
                     "nothing")
    if hash_seed is not None and scheme in ("kvcli", "sglang"):
        notes.append(f"--hash-seed is not used by --hash {scheme} (its root does not depend on PYTHONHASHSEED)")
    for t in traces:
        if request_id is not None and t.tokens:
            found = t.explanation.matching(request_id)
            if len(found) > 1:
                notes.append(f"{t.name}: id {request_id!r} names {len(found):,} requests ({found[0].source}, "
                             f"{found[1].source}{', ...' if len(found) > 2 else ''}): mapped the first; "
                             f"--request {found[1].source} maps another")
            if found and scheme.startswith("vllm") and found[0].model:
                notes.append(f"{t.name}: request {found[0].id} names model {found[0].model!r}: if that is a LoRA "
                             f"adapter, vLLM puts the adapter (its name, id or path, by version) in every block's "
                             f"hash, which a trace does not give; --hash {scheme} hashes it as the base model's")
            if scheme != "kvcli" and t.fmt in HASH_ID_FORMATS:
                notes.append(f"{t.name}: a hash-id trace's token ids are synthesized, so --hash {scheme} hashes "
                             "tokens no engine saw: its hashes join no engine's logs")
    if namespace is not None and traces and not any(t.explanation.reused_from_namespace_tokens for t in traces):
        notes.append(f"namespace {namespace!r} added no reused token: does it hold chunks of chunk size "
                     f"{traces[0].explanation.config.chunk_size} for this model and tokenizer? (kvcli inspect "
                     f"--namespace {namespace})")
    return notes


def spans(e: Explanation) -> list[tuple[str, int, int]]:
    """The request's tokens on the token axis, ``(cause, start, end)`` (end exclusive; empty spans left out), in
    position order: reused, then expiry, eviction, hybrid_block, chunk_boundary, last_token, cache_salt, then
    divergence or new
    (the counts of :class:`~kvcli.analysis.explain.Explanation`, laid where they fall)."""
    lost, n = e.lost_tokens_by_cause, e.prompt_tokens
    order = ["reused", *TOKEN_ORDER]
    sizes = {"reused": e.reused_tokens, **lost}
    out, at = [], 0
    for cause in order:
        if sizes[cause]:
            out.append((cause, at, at + sizes[cause]))
            at += sizes[cause]
    assert at == n, (at, n)
    return out


def chunk_map(t: ExplainedTrace, e: Explanation, block_hashes: BlockHashes | None) -> list[dict]:
    """One row per chunk of request ``e`` (full chunks, then the partial tail): its tokens, the causes of its
    tokens, its block hash and its predecessor's for the same chunk (``block_hashes``; None: no hashes), and
    whether the LRU held it and it was unexpired when the request came (with a capacity or TTL)."""
    cs = t.explanation.config.chunk_size
    n = e.prompt_tokens
    laid = spans(e)
    ours = t.tokens.get(e.index)
    theirs = t.tokens.get(e.predecessor) if e.predecessor >= 0 else None
    pred = t.explanation.explained[e.predecessor] if e.predecessor >= 0 else None
    mine = block_hashes.hashes(ours, e.cache_salt) if block_hashes and ours is not None else []
    other = block_hashes.hashes(theirs, pred.cache_salt) if block_hashes and theirs is not None and pred else []
    states = t.explanation.chunk_states.get(e.index)
    rows = []
    for k, start in enumerate(range(0, n, cs)):
        end = min(n, start + cs)
        parts = {c: min(end, b) - max(start, a) for c, a, b in laid if min(end, b) > max(start, a)}
        row = {"chunk": k, "start_token": start, "end_token": end, "full": end - start == cs, "tokens_by_cause": parts,
               "hash": mine[k] if k < len(mine) else None,
               "predecessor_hash": other[k] if k < len(other) else None}
        if states is not None and k < len(states):
            row["held"], row["unexpired"] = states[k]
        rows.append(row)
    return rows


# -------------------------------------------------------------------------------------------------------- text

def print_explained(traces: list[ExplainedTrace], console: Console, top: int, request_id: str | None = None,
                    block_hashes: BlockHashes | None = None) -> None:
    """Per trace: the causes table, the top divergence sites (each with its example's excerpts) and the requests
    that lost most, then what each cause means (once); with ``request_id``, that request's chunk map instead."""
    for t in traces:
        x = t.explanation
        cache = _cache_label(x)
        if request_id is not None:
            if t.tokens:
                _print_request(t, x.request(request_id), console, block_hashes, cache)
            continue
        print_table(console, _causes_table(t, cache), keep=1)
        sites = x.top_sites(top)
        if sites:
            print_table(console, _sites_table(t, sites), keep=1)
            for s in sites:
                if s.example is not None and s.example.ours is not None:
                    console.print(Text(f"  {s.label}, e.g. {s.example_request}:"))
                    console.print(Text(f"    this prompt:     {s.example.ours}"))
                    console.print(Text(f"    its predecessor: {s.example.theirs}"))
        worst = _worst(x)
        if worst:
            print_table(console, _worst_table(t, worst), keep=1)
        for note in t.notes:
            console.print(Text(f"{t.name}: {note}"))
        if x.skipped_empty:
            console.print(Text(f"{t.name}: {x.skipped_empty:,} empty prompts skipped (as replay skips them)"))
    if request_id is None and traces:
        console.print(Text("what the tokens are: " + "; ".join(f"{c.replace('_', ' ')}: {m}"
                                                               for c, m in CAUSE_HELP.items())))


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "–"


def _causes_table(t: ExplainedTrace, cache: str) -> Table:
    x = t.explanation
    table = Table(title=Text(f"{t.name}: {x.requests:,} requests, {x.prompt_tokens:,} prompt tokens ({cache}): where "
                             "they went"), title_justify="left")
    for column in ("tokens", "count", "of prompt tokens"):
        table.add_column(column, justify="left" if column == "tokens" else "right")
    table.add_row("reused", f"{x.reused_tokens:,}", _share(x.reused_tokens, x.prompt_tokens))
    if x.reused_from_namespace_tokens:
        table.add_row("  of them only in the namespace", f"{x.reused_from_namespace_tokens:,}",
                      _share(x.reused_from_namespace_tokens, x.prompt_tokens))
    for cause in CAUSES:
        n = x.lost_tokens_by_cause[cause]
        if cause == "hybrid_block" and x.config.hybrid_block is None:
            continue  # not a hybrid model: no such limit
        table.add_row(f"lost: {cause.replace('_', ' ')}" if cause != "new" else "new", f"{n:,}",
                      _share(n, x.prompt_tokens))
    table.caption = (f"upper bound (unlimited, token-granular): {x.upper_bound_tokens:,} tokens "
                     f"({_share(x.upper_bound_tokens, x.prompt_tokens)}) = reused + chunk boundary + "
                     + ("hybrid block + " if x.config.hybrid_block is not None else "") + "eviction + expiry")
    if x.config.engine is not None and x.config.engine.max_num_seqs > 1:
        table.caption += (f"; engine preemptions: {x.preemptions:,}; reused tokens in blocks a running request "
                          f"held: {x.pinned_tokens:,}")
    table.caption_justify = "left"
    return table


def _sites_table(t: ExplainedTrace, sites) -> Table:
    table = Table(title=Text(f"{t.name}: where prompts first differ from their best predecessor, by tokens after "
                             "it (a new conversation that shares only a system prompt diverges after it)"),
                  title_justify="left")
    for column in ("site", "requests", "tokens after it", "of prompt tokens"):
        table.add_column(column, justify="left" if column == "site" else "right", overflow="fold")
    total = t.explanation.prompt_tokens
    for s in sites:
        table.add_row(s.label, f"{s.requests:,}", f"{s.tokens:,}", _share(s.tokens, total))
    return table


def _lost(e: Explanation) -> int:
    return sum(v for c, v in e.lost_tokens_by_cause.items() if c != "new")


def _worst(x: TraceExplanation) -> list[Explanation]:
    ranked = sorted((e for e in x.explained if _lost(e)), key=lambda e: (-_lost(e), e.index))
    return ranked[:WORST_REQUESTS]


def _worst_table(t: ExplainedTrace, worst: list[Explanation]) -> Table:
    x = t.explanation
    table = Table(title=Text(f"{t.name}: the requests that lost the most tokens (every cause but new; "
                             "kvcli explain --request ID maps one)"), title_justify="left")
    for column in ("request", "prompt", "reused", "lost", "mostly", "predecessor"):
        table.add_column(column, justify="left" if column in ("request", "mostly", "predecessor") else "right",
                         overflow="fold")
    for e in worst:
        cause = max((c for c in CAUSES if c != "new"), key=lambda c: e.lost_tokens_by_cause[c])
        pred = x.explained[e.predecessor].id if e.predecessor >= 0 else "–"
        table.add_row(e.id, f"{e.prompt_tokens:,}", f"{e.reused_tokens:,}", f"{_lost(e):,}", cause.replace("_", " "),
                      pred)
    return table


def _short(block_hash: str | None) -> str:
    """A block hash as the chunk map prints it: its first 16 characters (the JSON has it whole)."""
    if block_hash is None:
        return "–"
    return block_hash if len(block_hash) <= 16 else block_hash[:16] + "…"


def _print_request(t: ExplainedTrace, e: Explanation, console: Console, block_hashes: BlockHashes | None,
                   cache: str) -> None:
    x = t.explanation
    pred = x.explained[e.predecessor] if e.predecessor >= 0 else None
    head = (f"request {e.id} ({e.source or t.name}): {e.prompt_tokens:,} prompt tokens, reused {e.reused_tokens:,} "
            f"({cache}); best prefix {e.best_prefix_tokens_any_salt:,} tokens"
            + (f" from {pred.id} ({pred.source})" if pred else " (no earlier prompt shares a token)"))
    console.print(Text(head))
    if e.best_prefix_tokens != e.best_prefix_tokens_any_salt and pred is not None and pred.model != e.model:
        console.print(Text(f"  its model {e.model!r} shares only {e.best_prefix_tokens:,} of them (the "
                           f"predecessor's model: {pred.model!r}; requests of two models never share blocks)"))
    elif e.best_prefix_tokens != e.best_prefix_tokens_any_salt:
        console.print(Text(f"  its cache salt {e.cache_salt!r} shares only {e.best_prefix_tokens:,} of them "
                           f"(the predecessor's salt: {pred.cache_salt if pred else ''!r})"))
    if e.site is not None:
        console.print(Text(f"  differs from it at token {e.site.token:,}: {e.site.label}"))
        if e.site.ours is not None:
            console.print(Text(f"    this prompt: {e.site.ours}"))
            console.print(Text(f"    predecessor: {e.site.theirs}"))
    lost = ", ".join(f"{c.replace('_', ' ')} {v:,}" for c, v in e.lost_tokens_by_cause.items() if v)
    console.print(Text(f"  tokens: reused {e.reused_tokens:,}" + (f"; {lost}" if lost else "")))
    rows = chunk_map(t, e, block_hashes)
    scheme = block_hashes.scheme if block_hashes else None
    table = Table(title=Text(f"chunk map of {e.id}" + (f" (block hashes: {scheme}, first 16 digits; --json has "
                                                          "them whole)" if scheme else "")),
                  title_justify="left")
    columns = ["chunk", "tokens", "what its tokens are"]
    if scheme:
        columns += ["hash", "predecessor's"]
    if rows and "held" in rows[0]:
        columns += ["held", "unexpired"]
    for column in columns:
        table.add_column(column, justify="right" if column == "chunk" else "left", overflow="fold")
    for r in rows:
        what = ", ".join(f"{c.replace('_', ' ')} {v}" if len(r["tokens_by_cause"]) > 1 else c.replace("_", " ")
                         for c, v in r["tokens_by_cause"].items())
        cells = [str(r["chunk"]), f"{r['start_token']:,}-{r['end_token'] - 1:,}" + ("" if r["full"] else " (partial)"),
                 what]
        if scheme:
            h, p = r["hash"], r["predecessor_hash"]
            cells += [_short(h), "same" if h is not None and h == p else _short(p)]
        if "held" in r:
            cells += ["yes" if r["held"] else "no", "yes" if r["unexpired"] else "no"]
        table.add_row(*cells)
    print_table(console, table, keep=1)
