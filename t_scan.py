import time, cProfile, pstats
from kvcli.store.server import open_redis
from kvcli.store import cluster
from kvcli.store.namespace import purge, count
with open_redis(None) as (client, _):
    pipe = client.pipeline(transaction=False)
    for i in range(114000):
        pipe.set(f"kvcli:v1:ns:512:m:{i:032x}", b"x"*150)
    pipe.execute()
    pr=cProfile.Profile(); pr.enable()
    t=time.perf_counter(); print(purge(client,"ns").deleted, round(time.perf_counter()-t,3))
    pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(8)
