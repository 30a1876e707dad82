"""kvcli route as a library: RouteConfig's checks and what it derives, and route_traces' reports and events.

Conventions as tests/route/test_route.py: chunk size 4, prefill at 64 tokens/s, one output token.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvcli.errors import BadInputError
from kvcli.route.config import RouteConfig
from kvcli.route.events import RouteEvents
from kvcli.route.runner import route_traces
from kvcli.route.simulator import SimConfig

SIM = SimConfig(nodes=2, capacity_tokens=None, chunk_size=4, count_measured_latency=False)


def route_config(**kw) -> RouteConfig:
    return RouteConfig(**{"sim": SIM, "policies": ("prefix", "round-robin"), "prefill_tps": 64.0, **kw})


def test_config_resolves_policies_and_expands_sweeps():
    config = route_config(policies=("prefix,cost", "prefix"), sweeps=("w=1,2", "nodes=3"))
    assert config.policies == ("prefix", "cost")
    assert [(labels, c.cost_weight, c.nodes) for labels, c in config.points] == [
        ({"w": "1", "nodes": "3"}, 1.0, 3), ({"w": "2", "nodes": "3"}, 2.0, 3)]
    assert route_config().points == (({}, SIM),)


def test_idle_sweeps_are_the_parameters_no_policy_run_depends_on():
    assert route_config(policies=("prefix",), sweeps=("w=1,2", "nodes=2,3")).idle_sweeps == ["w"]
    assert route_config(policies=("cost",), sweeps=("w=1,2",)).idle_sweeps == []


@pytest.mark.parametrize("kw,message", [
    ({"model": "nope"}, "unknown model preset 'nope'"),
    ({"limit": 0}, "--limit must be >= 1, got 0"),
    ({"threads": 0}, "--threads must be >= 1, got 0"),
    ({"sweeps": ("colour=1",)}, "bad --sweep 'colour=1'"),
    ({"policies": ("nearest",)}, "unknown policy 'nearest'"),
    ({"prefill_tps": 0.0}, "--prefill-tps must be a finite number > 0, got 0.0"),
    ({"plot": Path("x.pdf")}, "--plot must end in .png or .svg, got 'x.pdf'"),
    ({"model": "nope", "limit": 0, "prefill_tps": 0.0}, "unknown model preset 'nope'"),  # the first check wins
    ({"limit": 0, "threads": 0}, "--limit must be >= 1, got 0"),
    ({"policies": ("nearest",), "plot": Path("x.pdf")}, "unknown policy 'nearest'"),
])
def test_config_refuses_bad_options_naming_the_option(kw, message):
    with pytest.raises(BadInputError, match="^" + re.escape(message)):
        route_config(**kw)


class Recorder(RouteEvents):
    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def note(self, line: str) -> None:
        self.seen.append(("note", line))

    def reading(self, name, requests):
        self.seen.append(("reading", name))
        return requests

    def simulating(self, name: str, runs: int) -> None:
        self.seen.append(("simulating", name, runs))

    def run(self, what: str) -> None:
        self.seen.append(("run", what))

    def simulated(self, name: str) -> None:
        self.seen.append(("simulated", name))


def test_route_traces_reports_each_trace_and_tells_its_events(tmp_path):
    rows = [{"id": "late", "token_ids": list(range(1, 10)), "timestamp": 5},
            {"id": "early", "token_ids": list(range(1, 10)), "timestamp": 1}]
    unsorted = tmp_path / "unsorted.jsonl"
    unsorted.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sorted_ = tmp_path / "sorted.jsonl"
    sorted_.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))
    events = Recorder()
    reports = route_traces([unsorted, sorted_], route_config(sweeps=("w=1,2",)), "auto", events)
    idle = "--sweep w changes none of the policies run (prefix, round-robin); each runs once"
    reordered = ("unsorted.jsonl is not sorted by timestamp (2 of 2 requests out of place): requests are taken in "
                 "timestamp order (stable), the order every kvcli command uses")
    assert events.seen == [
        ("note", idle),
        ("reading", "unsorted.jsonl"), ("note", reordered), ("simulating", "unsorted.jsonl", 2), ("run", "prefix"),
        ("run", "round-robin"), ("simulated", "unsorted.jsonl"),
        ("reading", "sorted.jsonl"), ("simulating", "sorted.jsonl", 2), ("run", "prefix"), ("run", "round-robin"),
        ("simulated", "sorted.jsonl")]
    assert [(r["trace"], r["notes"]) for r in reports] == [("unsorted.jsonl", [reordered]), ("sorted.jsonl", [])]
    assert reports[0]["cost_curve"]["source"] == "--prefill-tps 64"
    # 9 tokens, 2 full chunks; the second request hits both on prefix's node: 8 of 18 tokens
    assert [(r["policy"], r["hit_tokens"]) for r in reports[0]["runs"]] == [("prefix", 8), ("round-robin", 0)]


def test_route_traces_writes_a_plot_per_trace(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"token_ids": [1, 2, 3, 4, 5], "timestamp": t}) + "\n" for t in (0, 1)))
    route_traces([trace], route_config(plot=tmp_path / "p.svg"))
    assert (tmp_path / "p.svg").stat().st_size > 1000
