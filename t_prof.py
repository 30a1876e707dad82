import cProfile, pstats, time, sys
from pathlib import Path
from kvcli.store.server import open_redis
from kvcli.replay.replayer import Replayer
from kvcli.replay.results import ReplayConfig
from kvcli.model.costcurve import CostCurve
from kvcli.model.presets import model_spec
from kvcli.traces.detect import read_trace
P = Path("/work/shared/traces/mooncake/conversation_trace.first7500.jsonl")
with open_redis(None) as (client, _):
    cfg = ReplayConfig(chunk_sizes=(512,), payload="accounted", measure=0, upper_bound=False)
    r = Replayer(client, None, CostCurve.from_tokens_per_second(3000), "cl100k_base", cfg, spec=model_spec("cpu"))
    t=time.perf_counter()
    pr = cProfile.Profile(); pr.enable()
    res = r.replay(str(P), lambda: read_trace(P))
    pr.disable()
    print(time.perf_counter()-t, res.per_chunk_size[0].hit_tokens)
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)
