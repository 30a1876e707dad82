"""Restricted Redis users: a user without INFO (``~kvcli:* +@all -@dangerous -@admin``) runs replay, warm,
inspect and purge, and what needs INFO degrades with a note; a user without SCAN gets the replay report, then
exit 3 naming the keys it could not delete and the command that removes them. Each test starts its own private
server with ACL users (never the machine's 6379).
"""
from __future__ import annotations

import json

import pytest
import redis
from test_warm import cli_app
from typer.testing import CliRunner

from kvcli.live.inspect import inspect_cache

TOKENS = list(range(1, 11))
NO_INFO = ["~kvcli:*", "+@all", "-@dangerous", "-@admin"]


@pytest.fixture
def acl_server(make_server):
    """``(admin client, url for a user with these rules)`` on a fresh private server."""
    def make(rules: list[str]) -> tuple[redis.Redis, str]:
        url = make_server()
        admin = redis.Redis.from_url(url)
        admin.execute_command("ACL", "SETUSER", "kv", "on", ">pw", *rules)
        admin.set("foreign", "1")
        return admin, url.replace("redis://", "redis://kv:pw@")
    return make


def _invoke(*args: str):
    return CliRunner().invoke(cli_app(), list(args))


def _trace(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(2 * (json.dumps({"token_ids": TOKENS}) + "\n"))
    return path


def test_the_user_cannot_run_info(acl_server):
    _, url = acl_server(NO_INFO)
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis.from_url(url).info()


def test_replay_without_info_works_and_says_what_it_could_not_read(acl_server, tmp_path):
    admin, url = acl_server(NO_INFO)
    out = _invoke("replay", str(_trace(tmp_path)), "--chunk-sizes", "4", "--measure", "0", "--prefill-tps", "1000",
                  "--payload", "accounted", "--redis-url", url, "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    trace, row = doc["traces"][0], doc["traces"][0]["per_chunk_size"][0]
    assert (row["hit_tokens"], row["prompt_tokens"], row["redis_memory_sampled_keys"]) == (8, 20, 2)
    assert trace["used_memory_delta_bytes"] is None
    assert any("may not run INFO" in note for note in trace["notes"])
    assert "may not run INFO" in doc["context"]["redis_version"]
    assert sorted(admin.scan_iter("*")) == [b"foreign"]


def test_warm_inspect_and_purge_without_info(acl_server, tmp_path):
    admin, url = acl_server(NO_INFO)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"token_ids": TOKENS}) + "\n")
    out = _invoke("warm", str(prompts), "--model", "tiny", "--chunk-size", "4", "--namespace", "fleet",
                  "--redis-url", url, "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["totals"]["chunks_written"] == 2 and doc["evicted_keys"] is None
    assert doc["preflight"]["fits"] is None and "may not run INFO" in doc["preflight"]["message"]
    out = _invoke("inspect", "--redis-url", url, "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["server"]["used_memory"] is None and "may not run INFO" in doc["server"]["note"]
    assert (doc["keys"]["kvcli"], doc["keys"]["other"]) == (4, 1)
    assert doc["groups"][0]["chunks"] == 2 and not doc["groups"][0]["integrity"]
    out = _invoke("inspect", "--redis-url", url)  # the table view too
    assert out.exit_code == 0 and "may not run INFO" in out.stdout, out.output
    out = _invoke("inspect", "--tokens", str(_ids(tmp_path)), "--model", "tiny", "--chunk-size", "4",
                  "--namespace", "fleet", "--redis-url", url, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["chunk_maps"][0]["hit_tokens"] == 8
    out = _invoke("purge", "--namespace", "fleet", "--yes", "--redis-url", url)
    assert out.exit_code == 0, out.output
    assert sorted(admin.scan_iter("*")) == [b"foreign"]


def _ids(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text(" ".join(map(str, TOKENS)))
    return path


def test_replay_without_scan_deletes_what_it_wrote_from_its_record(acl_server, tmp_path):
    """A user without SCAN: the cleanup needs none (it UNLINKs the keys its stores recorded writing), so nothing of
    the run is left; only the memory sample, which scans, is said to be missing."""
    admin, url = acl_server(NO_INFO + ["-scan"])
    out = _invoke("replay", str(_trace(tmp_path)), "--chunk-sizes", "4", "--measure", "0", "--prefill-tps", "1000",
                  "--payload", "accounted", "--redis-url", url, "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["traces"][0]["per_chunk_size"][0]["hit_tokens"] == 8
    assert sorted(admin.scan_iter("*")) == [b"foreign"]
    assert "was not deleted" not in out.stderr and "pw@" not in out.output
    assert any("Redis memory of chunk size 4 not read" in n for n in doc["traces"][0]["notes"])


def test_replay_without_unlink_names_what_it_left_and_the_permission_it_needs(acl_server, tmp_path):
    # scripts allowed, UNLINK not: the replay runs (priced, it times no transfer: no probe to delete), then its
    # cleanup's UNLINK is refused
    admin, url = acl_server(NO_INFO + ["-unlink"])
    out = _invoke("replay", str(_trace(tmp_path)), "--chunk-sizes", "4", "--measure", "0", "--prefill-tps", "1000",
                  "--payload", "accounted", "--redis-url", url, "--json")
    assert out.exit_code == 3, out.output
    left = sorted(k for k in admin.scan_iter("*") if k != b"foreign")
    namespace = left[0].decode().split(":")[2]
    assert f"namespace {namespace} was not deleted (Redis UNLINK failed" in out.stderr
    # the two 4-token chunks of the 10-token prompt (both requests the same) and the run's sentinel
    assert "about 2 keys this run wrote (counted when it stopped) are left" in out.stderr and len(left) == 3
    assert "; run it as a user allowed SCAN and UNLINK" in out.stderr


def _warm(tmp_path, url: str):
    """warm TOKENS (two chunks of 4: one batch) into namespace "fleet" as the restricted user, --json."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"token_ids": TOKENS}) + "\n")
    return _invoke("warm", str(prompts), "--model", "tiny", "--chunk-size", "4", "--namespace", "fleet",
                   "--redis-url", url, "--json"), prompts


def _kvcli_keys(admin) -> dict[str, int]:
    """The server's kvcli keys by kind: ``{"m": metadata keys, "p": payload keys}``."""
    keys = [k.decode() for k in admin.scan_iter("kvcli:*")]
    return {kind: sum(1 for k in keys if k.split(":")[-2] == kind) for kind in ("m", "p")}


def test_warm_as_a_user_without_multi_writes_and_counts_its_chunks(acl_server, tmp_path):
    """MULTI refused by the ACL: warm's batches go without a transaction (payloads, then metadata), so both chunks
    are written and counted (2 chunks, 4 objects), each whole: nothing orphaned."""
    admin, url = acl_server(NO_INFO + ["-multi"])
    out, _ = _warm(tmp_path, url)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert (doc["totals"]["chunks_written"], doc["totals"]["objects_written"], doc["stopped"]) == (2, 4, "")
    assert _kvcli_keys(admin) == {"m": 2, "p": 2}
    group, = inspect_cache(admin, sample=0, verify=True).groups
    assert (group.chunks, dict(group.issues)) == (2, {})


# the user may read every kvcli key and write only one kind: the other kind's SET is refused
ONLY_METADATA = ["resetkeys", "%R~kvcli:*", "%W~kvcli:*:m:*"]
ONLY_PAYLOADS = ["resetkeys", "%R~kvcli:*", "%W~kvcli:*:p:*"]


@pytest.mark.parametrize("multi", [[], ["-multi"]], ids=["multi", "no-multi"])
@pytest.mark.parametrize("writable", [ONLY_METADATA, ONLY_PAYLOADS], ids=["metadata", "payloads"])
def test_warm_as_a_user_allowed_one_kind_of_key_writes_nothing_and_says_so(acl_server, tmp_path, multi, writable):
    """With MULTI, the batch is one transaction, aborted whole by its refused SET. Without MULTI, only metadata keys
    writable: the payloads are refused, so no metadata is written; only payload keys: the payloads are written,
    their metadata refused, and the payloads deleted again. Either way the server holds no kvcli key, the run says
    it wrote 0 objects, and the error names the refused batch, chunks 0-1."""
    admin, url = acl_server(NO_INFO + multi + writable)
    out, prompts = _warm(tmp_path, url)
    assert out.exit_code == 3, out.output
    assert json.loads(out.stdout)["totals"]["objects_written"] == 0
    assert (f"kvcli: error: the server refused the batch of chunks 0-1 (tokens 0-8) of {prompts}:1 at chunk size 4: "
            f"No permissions to access a key") in out.stderr
    assert "stopped there, everything before it is stored\n" in out.stderr
    assert _kvcli_keys(admin) == {"m": 0, "p": 0}
    assert sorted(admin.scan_iter("*")) == [b"foreign"]


def test_warm_names_the_keys_it_wrote_and_may_not_delete(acl_server, tmp_path):
    """No MULTI, only payload keys writable, and no UNLINK: the two payloads are written, their metadata refused,
    and they cannot be deleted again. warm reports 0 objects written (no chunk is stored) and names the 2 payload
    keys it leaves (no lookup reads a payload without metadata)."""
    admin, url = acl_server(NO_INFO + ["-multi"] + ONLY_PAYLOADS + ["-unlink"])
    out, _ = _warm(tmp_path, url)
    assert out.exit_code == 3, out.output
    assert json.loads(out.stdout)["totals"]["objects_written"] == 0
    assert _kvcli_keys(admin) == {"m": 0, "p": 2}
    payloads = sorted(k.decode() for k in admin.scan_iter("kvcli:*"))
    assert (f"stopped there, everything before it is stored; 2 keys it wrote after that could not be deleted again "
            f"(UNLINK refused; no lookup reaches them): {payloads[0]}, {payloads[1]}\n") in out.stderr
