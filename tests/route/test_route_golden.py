"""`kvcli route --json` on the sample traces, pinned: every figure equal to a report computed by the simulator as it
was before its speed-up, stored in tests/route/data/route_golden.json.

The cases cover every policy, trace timestamps and Poisson ``--rate``, 2-8 nodes, capacities from heavy eviction to
unlimited, queueing (small ``--max-batch``), tenants (cache salts), the random ``cost`` and ``cache-manager`` paths.
Only wall-clock figures are left out (the measured Redis round trip of cache-manager lookups; ``--no-count-rtt``
keeps them out of the simulated times). To rewrite the golden file on purpose, after checking why it changed:
``python tests/route/test_route_golden.py --write``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "sample_traces"
GOLDEN = Path(__file__).resolve().parent / "data" / "route_golden.json"
IN_PROCESS = "round-robin,least-loaded,random,prefix,cache-aware,cost"
MOONCAKE = ("mooncake_conversation_head1000.jsonl.gz", "--chunk-size", 512, "--prefill-tps", 10000)

CASES: dict[str, tuple] = {
    "mooncake-timestamps-nodes-capacities": (
        *MOONCAKE, "-p", IN_PROCESS, "--sweep", "nodes=2,4,8",
        "--sweep", "node-capacity=300k tokens,3M tokens,unlimited"),
    "mooncake-rate-random-cost": (
        *MOONCAKE, "-p", IN_PROCESS, "--rate", 4, "--seed", 7, "--nodes", 3, "--node-capacity", "1M tokens",
        "--temperature", 2000, "--w", 0.5, "--sweep", "abs-threshold=4,32", "--sweep", "max-batch=8,64"),
    "glaive-rate-small-chunks": (
        "glaive_toolcall_head30.json", "--chunk-size", 16, "--prefill-tps", 2000, "-p", IN_PROCESS, "--rate", 2,
        "--max-batch", 4, "--decode-tpot", 0.01, "--sweep", "nodes=2,5",
        "--sweep", "node-capacity=2k tokens,unlimited"),
    "chat-tenants-timestamps": (
        "chat_shared_system.jsonl", "--chunk-size", 32, "--prefill-tps", 3000, "-p", IN_PROCESS, "--nodes", 3,
        "--node-capacity", "5k tokens", "--max-batch", 2, "--decode-tpot", 0.05, "--sweep", "cache-threshold=0.1,0.5"),
    "mooncake-cache-manager": (
        *MOONCAKE, "-p", "cache-manager", "--no-count-rtt", "--nodes", 4, "--node-capacity", "1M tokens",
        "--sweep", "lookup-delay=0,lognormal:1ms:50ms", "--lookup-timeout", "20ms"),
}


# A fitted-looking cost curve (overhead, per-token and attention terms all non-zero), through the library: the CLI
# measures its curve anew each run, so it cannot pin one. The same cost per pair among the new tokens (d) and with
# the cached ones (e): the attention cost the golden runs were made with.
FITTED = {"a": 0.0123456789, "b": 3.3333e-5, "d": 1.7e-9, "e": 1.7e-9}
FITTED_POINTS = [{"nodes": 3, "capacity_tokens": c, "chunk_size": 512, "rate": r}
                 for c in (400_000, None) for r in (None, 3.0)]


def run_fitted() -> list[dict]:
    """``run_routes`` of the in-process policies on the Mooncake sample with the :data:`FITTED` curve, as JSON."""
    from kvcli.model.costcurve import CostCurve
    from kvcli.route.report import run_routes
    from kvcli.route.simulator import SimConfig, load_requests

    requests = load_requests(TRACES / MOONCAKE[0], chunk_size=512)
    points = [({}, SimConfig(**p)) for p in FITTED_POINTS]
    return json.loads(json.dumps(run_routes(requests, IN_PROCESS.split(","), points, CostCurve(**FITTED))))


def run_case(args: tuple, redis_url: str | None) -> dict:
    """The ``kvcli route --json`` report of ``args`` (trace name first), without its wall-clock figures."""
    from kvcli.cli.route import route

    app = typer.Typer()
    app.callback()(lambda: None)
    app.command("route")(route)
    argv = ["route", str(TRACES / args[0]), *map(str, args[1:]), "--json"]
    if redis_url:
        argv += ["--redis-url", redis_url]
    res = CliRunner().invoke(app, argv, env={"REDIS_URL": None})
    assert res.exit_code == 0, res.output
    (report,) = json.loads(res.stdout)["traces"]  # the envelope (version, provenance) is not the simulation's
    for run in report["runs"]:
        del run["lookups"]["measured_seconds"]  # the real Redis round trip: wall clock
    return report


@pytest.mark.parametrize("case", CASES)
def test_route_report_equals_the_golden_one(case, redis_url):
    golden = json.loads(GOLDEN.read_text())
    assert golden["cases"][case]["args"] == [str(a) for a in CASES[case]]
    assert run_case(CASES[case], redis_url) == golden["cases"][case]["report"]


def test_fitted_cost_curve_runs_equal_the_golden_ones():
    golden = json.loads(GOLDEN.read_text())["fitted"]
    assert golden["curve"] == FITTED and golden["points"] == FITTED_POINTS
    assert run_fitted() == golden["runs"]


def write_golden() -> None:
    """Compute every case (on a private embedded server) and write the golden file."""
    from kvcli.store.server import embedded_server

    with embedded_server() as url:
        cases = {name: {"args": [str(a) for a in args], "report": run_case(args, url)} for name, args in CASES.items()}
    GOLDEN.parent.mkdir(exist_ok=True)
    fitted = {"curve": FITTED, "points": FITTED_POINTS, "runs": run_fitted()}
    GOLDEN.write_text(json.dumps({"cases": cases, "fitted": fitted}, indent=1) + "\n")
    print(f"wrote {GOLDEN} ({len(cases)} cases, {sum(len(c['report']['runs']) for c in cases.values())} runs)")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python {Path(__file__).name} --write")
    sys.path.insert(0, str(ROOT))  # this checkout's kvcli, not an installed one
    write_golden()
