"""The run's server check (kvcli.store.runmark): the same server with the sentinel passes; a flushed one does not;
the sentinel goes with the run's namespace."""
from __future__ import annotations

import pytest
import redis

from kvcli.store.namespace import count, purge_own
from kvcli.store.runmark import ServerRestarted, check_run, mark_run, write_sentinel
from kvcli.store.server import address


def test_the_sentinel_is_checked_and_purged_with_the_namespace(redis_client, redis_url):
    mark = mark_run(redis_client, "run", 16)
    write_sentinel(redis_client, mark)
    check_run(redis_client, mark)  # the same server, the sentinel there: quiet
    assert count(redis_client, "run").payloads == 1  # kvcli purge selects it
    assert purge_own(redis_client, "run") == 1 and redis_client.dbsize() == 0
    with pytest.raises(ServerRestarted, match=r"lost this replay's keys during the run \(its sentinel key "
                                              r"kvcli:v1:run:16:p:0{32} is gone"):
        check_run(redis_client, mark)


@pytest.mark.single_server("one server's run_id")
def test_another_run_id_is_a_restart(redis_client):
    mark = mark_run(redis_client, "run", 16)
    assert mark.run_id == redis_client.info("server")["run_id"]
    write_sentinel(redis_client, mark)
    other = type(mark)("0" * 40, mark.sentinel, mark.where)  # as if the server had restarted since
    with pytest.raises(ServerRestarted, match=f"the Redis server at {address(redis_client)} restarted during the "
                                              f"replay"):
        check_run(redis_client, other)


def test_the_address_names_no_password():
    client = redis.Redis.from_url("redis://user:secret@10.0.0.1:7000/3")
    assert address(client) == "redis://10.0.0.1:7000/3"
