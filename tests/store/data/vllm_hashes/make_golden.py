"""Golden block hashes of each vLLM version's own hashing code (run outside the test suite; see README.md).

Usage: python make_golden.py SRC_ROOT OUT.json, where SRC_ROOT/<version>/vllm/... holds each version's files as its
wheel ships them (``pip download vllm==<version> --no-deps``, unzipped). For each version the top-level definitions
of its ``vllm/v1/core/kv_cache_utils.py`` that hash blocks and those of its hashing module are taken out with ``ast``
and executed unchanged, then its own hasher runs on a stand-in request. Each case runs in a child process with the
case's PYTHONHASHSEED, twice, so a root that is random per process shows as ``"random"``.
"""
from __future__ import annotations
import __future__

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

VERSIONS = ["0.8.3", "0.8.5", "0.9.2", "0.10.0", "0.10.1", "0.10.2", "0.11.0", "0.11.1", "0.12.0", "0.13.0",
            "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.33.0", "0.34.0"]
KV_NAMES = {"BlockHashType", "BlockHash", "NONE_HASH", "DEFAULT_NONE_HASH_SEED", "_NON_CRYPTO_HASH_FUNCTIONS",
            "_CBOR_HASH_FUNCTIONS", "_NONE_HASH_SEED", "resolve_none_hash_seed", "init_none_hash", "need_extra_keys",
            "_gen_mm_extra_hash_keys", "_gen_lora_extra_hash_keys", "_gen_prompt_embeds_extra_hash_keys",
            "generate_block_hash_extra_keys", "hash_block_tokens", "hash_request_tokens", "get_request_block_hasher"}
HASH_NAMES = {"sha256", "sha256_cbor", "sha256_cbor_64bit", "_xxhash_digest", "xxhash", "xxhash_cbor",
              "get_hash_fn_by_name"}
P40 = list(range(1000, 1040))
BIG = [2**31 - 1 - i for i in range(40)]
LORA = {"lora_name": "sql-lora", "lora_int_id": 7, "lora_path": "/adapters/sql-lora"}


def _top(path: Path, names: set[str]) -> str:
    src = path.read_text()
    out = []
    for node in ast.parse(src).body:
        name = getattr(node, "name", None)
        if name is None and isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            name = getattr(target, "id", None)
        if name in names:
            out.append(ast.get_source_segment(src, node, padded=False))
    return "\n\n".join(out)


def _hashing_file(root: Path) -> Path:
    for rel in ("vllm/utils/hashing.py", "vllm/utils/__init__.py", "vllm/utils.py"):
        if (root / rel).exists() and "def sha256" in (root / rel).read_text():
            return root / rel
    raise FileNotFoundError(root)


def run_case(root: Path, algo: str, tokens: list[int], block_size: int, salt: str | None, lora: bool) -> list[str]:
    """In this process (PYTHONHASHSEED as the parent set it): the version's block hashes, as hex."""
    import hashlib
    import logging
    import pickle
    import typing
    from collections.abc import Callable, Sequence

    import cbor2
    import xxhash as _xxhash

    ns: dict = {"os": os, "hashlib": hashlib, "pickle": pickle, "cbor2": cbor2, "_xxhash": _xxhash,
                "logger": logging.getLogger("vllm"), "Any": typing.Any, "Callable": Callable,
                "Sequence": Sequence, "NamedTuple": typing.NamedTuple, "NewType": typing.NewType,
                "Optional": typing.Optional, "Union": typing.Union, "TypeAlias": typing.TypeAlias,
                "token_slice": lambda tokens, start, stop: tokens[start:stop]}
    flags = __future__.annotations.compiler_flag
    exec(compile(_top(_hashing_file(root), HASH_NAMES), "hashing", "exec", flags=flags, dont_inherit=True), ns)
    exec(compile(_top(root / "vllm/v1/core/kv_cache_utils.py", KV_NAMES), "kv_cache_utils", "exec", flags=flags,
                 dont_inherit=True), ns)
    # before get_hash_fn_by_name (vLLM <= 0.10.0) the KV cache manager picked the function of that name
    fn = ns["get_hash_fn_by_name"](algo) if "get_hash_fn_by_name" in ns else ns[algo]
    if "init_none_hash" in ns:
        ns["init_none_hash"](fn)

    class Lora:
        lora_name, lora_int_id, lora_path = LORA["lora_name"], LORA["lora_int_id"], LORA["lora_path"]

    class Req:
        def __init__(self) -> None:
            self.all_token_ids = self._all_token_ids = list(tokens)
            self.num_tokens = len(tokens)
            self.block_hashes: list = []
            self.cache_salt = salt
            self.lora_request = Lora() if lora else None
            self.mm_positions: list = []
            self.mm_hashes: list = []
            self.mm_features: list = []
            self.mm_inputs: list = []
            self.prompt_embeds = None
            self._prompt_embeds_per_block_hashes: dict = {}
            self.request_id = "r0"

    req = Req()
    if "get_request_block_hasher" in ns:
        hashes = ns["get_request_block_hasher"](block_size, fn)(req)
    else:
        hashes = ns["hash_request_tokens"](fn, block_size, req)
    out = []
    for h in hashes:
        value = getattr(h, "hash_value", h)
        out.append(value.hex() if isinstance(value, bytes) else format(value, "x"))
    return out


def _child(version_root: str, case: dict, seed: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    got = subprocess.run([sys.executable, __file__, "--case", version_root, json.dumps(case)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(got.stdout)


def algos(root: Path) -> list[str]:
    text = _hashing_file(root).read_text()
    names = [a for a in ("sha256", "sha256_cbor", "sha256_cbor_64bit", "xxhash", "xxhash_cbor")
             if f"def {a}(" in text]
    return names


def main(src_root: str, out: str) -> None:
    rows = []
    for version in VERSIONS:
        root = Path(src_root) / version
        for algo in algos(root):
            for tokens_name, tokens in (("P40", P40), ("BIG", BIG)):
                for salt in (None, "tenant-a"):
                    for lora in (False, True):
                        if tokens_name == "BIG" and (salt or lora):
                            continue
                        for seed in (None, "0", "42"):
                            case = {"algo": algo, "tokens": tokens, "block_size": 16, "salt": salt, "lora": lora}
                            first, second = _child(str(root), case, seed), _child(str(root), case, seed)
                            rows.append({"version": version, "algo": algo, "tokens": tokens_name, "block_size": 16,
                                         "cache_salt": salt or "", "lora": lora, "hash_seed": seed,
                                         "hashes": first if first == second else "random"})
        print(version, file=sys.stderr)
    Path(out).write_text(json.dumps({"lora": LORA, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--case":
        c = json.loads(sys.argv[3])
        print(json.dumps(run_case(Path(sys.argv[2]), c["algo"], c["tokens"], c["block_size"], c["salt"], c["lora"])))
    else:
        main(sys.argv[1], sys.argv[2])
