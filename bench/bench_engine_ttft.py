"""A profile's predicted time to first token against the engine's measured one, at points the profile did not time.

    python bench/bench_engine_ttft.py http://127.0.0.1:8000 profile.json --points 1536:0 3072:0 256:2048 ...

The profile is one ``kvcli profile --engine URL`` wrote for the same engine; each ``NEW:CACHED`` point is timed as
the profile's own points are (:func:`kvcli.model.engine_profile.time_engine_points`: a fresh prefix of CACHED
random token ids sent, then it plus NEW fresh ones, the engine's cached-token count confirmed; ``--warmup`` rounds
first, ``--repeats`` interleaved rounds). Printed, as a Markdown table: the measured min and median TTFT, the
profile's prediction ``t(new, cached)`` (:meth:`kvcli.model.costcurve.CostCurve.seconds` of its fit) and the
prediction's error against the measured min (the fit is of each point's fastest repeat).
"""
from __future__ import annotations

import argparse
import statistics
import sys

from kvcli.model.engine_client import EngineClient
from kvcli.model.engine_profile import EngineRun, time_engine_points
from kvcli.model.profile import Profile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("profile")
    ap.add_argument("--points", nargs="+", required=True, help="NEW:CACHED token counts")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    profile = Profile.load(args.profile)
    curve = profile.curve()
    points = [(int(n), int(c)) for n, c in (p.split(":") for p in args.points)]
    with EngineClient(args.url) as client:
        info = client.info(profile.engine["served_model"] if profile.engine else None)
        run = EngineRun(profile.shapes.vocab, None, args.repeats, args.warmup)
        timed, skipped = time_engine_points(client, info, points, run)
    print("| new | cached | measured min s | measured median s | predicted s | predicted vs min |")
    print("|---:|---:|---:|---:|---:|---:|")
    for p in timed:
        fastest, predicted = min(p.seconds), curve.seconds(p.new_tokens, p.cached_tokens)
        print(f"| {p.new_tokens:,} | {p.cached_tokens:,} | {fastest:.4f} | {statistics.median(p.seconds):.4f} | "
              f"{predicted:.4f} | {predicted / fastest - 1:+.0%} |")
    for s in skipped:
        print(f"skipped {s.new_tokens}:{s.cached_tokens}: {s.reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
