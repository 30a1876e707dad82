import time, sys
from pathlib import Path
from kvcli.store.server import open_redis
from kvcli.replay.replayer import Replayer
from kvcli.replay.results import ReplayConfig
from kvcli.model.costcurve import CostCurve
from kvcli.model.presets import model_spec
from kvcli.traces.detect import read_trace
from kvcli.store.namespace import purge, redis_memory, count
P = Path("/work/shared/traces/mooncake/conversation_trace.first7500.jsonl")
with open_redis(None) as (client, _):
    cfg = ReplayConfig(chunk_sizes=(512,), payload="accounted", measure=0, upper_bound=False, keep=True)
    r = Replayer(client, None, CostCurve.from_tokens_per_second(3000), "cl100k_base", cfg, spec=model_spec("cpu"))
    res = r.replay(str(P), lambda: read_trace(P))
    ns = res.per_chunk_size[0].namespace
    for f in (lambda: redis_memory(client, ns, 512, 200), lambda: count(client, ns), lambda: purge(client, ns)):
        t=time.perf_counter(); out=f(); print(round(time.perf_counter()-t,3), out if not hasattr(out,'keys') else out.keys)
