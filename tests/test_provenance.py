"""Every JSON document says which kvcli made it, with which command line (passwords masked), when, for how long
and on what machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata

from hypothesis import given
from hypothesis import strategies as st

from kvcli import __version__, provenance
from kvcli.redact import mask_argv
from kvcli.units import json_document


def test_mask_argv_masks_every_url_password_and_nothing_else():
    argv = ["kvcli", "replay", "t.jsonl", "--redis-url", "redis://alice:s3cret@db:6379/0",
            "--redis-url=rediss://:hunter2@db:6380?ssl_cert_reqs=none", "--namespace", "s3cret-free",
            "unix:///tmp/r.sock?password=pw9&db=1"]
    assert mask_argv(argv) == ["kvcli", "replay", "t.jsonl", "--redis-url", "redis://alice:***@db:6379/0",
                               "--redis-url=rediss://:***@db:6380?ssl_cert_reqs=none", "--namespace", "s3cret-free",
                               "unix:///tmp/r.sock?password=***&db=1"]


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters=":/@"), max_size=12), max_size=6))
def test_mask_argv_leaves_arguments_without_urls_alone(argv):
    assert mask_argv(argv) == argv


def test_a_document_carries_the_provenance_of_its_command():
    provenance.begin(["kvcli", "inspect", "--redis-url", "redis://:pw@h:1", "--json"])
    doc = json.loads(json_document("inspect", {"keys": 3}))
    assert list(doc) == ["schema_version", "command", "provenance", "keys"]
    p = doc["provenance"]
    assert p["kvcli_version"] == __version__
    assert p["command_line"] == ["kvcli", "inspect", "--redis-url", "redis://:***@h:1", "--json"]
    started = datetime.fromisoformat(p["started_at"].replace("Z", "+00:00"))
    assert abs((datetime.now(timezone.utc) - started).total_seconds()) < 3600 and p["started_at"].endswith("Z")
    assert 0 <= p["elapsed_seconds"] < 3600
    host = p["host"]
    assert (host["cores"], host["python"]) == (os.cpu_count(), sys.version.split()[0])
    assert host["libraries"]["torch"] == metadata.version("torch")
    assert host["libraries"]["redis"] == metadata.version("redis")
    assert host["cpu"] and host["memory_bytes"] > 0 and isinstance(host["gpus"], list)


def test_the_command_line_is_what_the_process_was_given():
    out = subprocess.run([sys.executable, "-m", "kvcli", "hardware", "h100-sxm", "--json"], capture_output=True,
                         text=True, check=True).stdout
    p = json.loads(out)["provenance"]
    assert p["command_line"][1:] == ["hardware", "h100-sxm", "--json"]
    assert p["elapsed_seconds"] > 0
