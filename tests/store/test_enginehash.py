"""kvcli.store.enginehash: each engine's block hashes, checked against vectors its own code produced.

Where the golden vectors come from (Python 3.11.7 on x86-64 Linux, a scratch venv with cbor2 6.3.0, xxhash 4.1.0,
pybind11 3.1.0; ``pip download <pkg>==<version> --no-deps``, ``unzip`` of the wheel, then the engine's own
functions run on the prompts below; the scratch script is not part of the repository):

* vLLM 0.33.0 (``vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl``): ``vllm/utils/hashing.py`` imported as is
  (``get_hash_fn_by_name``); from ``vllm/v1/core/kv_cache_utils.py`` the top-level definitions ``BlockHash``,
  ``DEFAULT_NONE_HASH_SEED``, ``_NON_CRYPTO_HASH_FUNCTIONS``, ``resolve_none_hash_seed``, ``init_none_hash``,
  ``generate_block_hash_extra_keys`` (and its ``_gen_*_extra_hash_keys``), ``hash_block_tokens`` and
  ``get_request_block_hasher`` taken out with ``ast`` and executed unchanged. Per algorithm:
  ``init_none_hash(fn)``, then ``get_request_block_hasher(16, fn)(request)`` on a stand-in request
  (``all_token_ids``, ``num_tokens``, ``block_hashes=[]``, ``cache_salt`` "tenant-a" or None, no multimodal
  features, LoRA or prompt embeddings); ``[h.hex() for h in ...]``. Run once with PYTHONHASHSEED unset (SHA-256
  rows, seed None here) and once with ``PYTHONHASHSEED=42``.
* LMCache 0.5.6 (``lmcache-0.5.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl``):
  ``lmcache/v1/token_database.py`` imported as is over the vLLM 0.33.0 modules above (torch, transformers and
  lmcache's logging/utils/config/metadata stubbed: the hashing touches none of them);
  ``ChunkedTokenDatabase(config, None)`` with ``chunk_size`` 16 or 256, ``save_unfull_chunk=False`` and
  ``pre_caching_hash_algorithm`` builtin / sha256 / sha256_cbor / xxhash / xxhash_cbor, then
  ``[h for _, _, h in db.process_tokens(tokens=list(ids), make_key=False)]``, printed here as ``format(h, "x")``.
  Run with PYTHONHASHSEED unset, ``=42`` and ``=0``.
* SGLang 0.5.23 (``sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl``):
  ``sglang/srt/mem_cache/cpp_utils/hash_binding.cpp`` compiled as the extension it loads (``g++ -O3 -std=c++17
  -DNDEBUG -mavx2 -shared -fPIC $(python -m pybind11 --includes) -DTORCH_EXTENSION_NAME=hicache_hash_cpp
  hash_binding.cpp -lcrypto``), ``cpp_utils/native_hash.py`` imported as is with ``_load_native_hash_module``
  returning it, and ``get_hash_str`` / ``storage_namespace_seed`` / ``get_storage_hash_str`` from
  ``sglang/srt/mem_cache/utils.py`` taken out with ``ast``: ``get_storage_hash_str(key, None, page_size=16)`` for a
  key of the page-aligned tokens (``raw_token_ids()`` an ``array('I')``, ``extra_key`` None, ``cache_salt`` None or
  "tenant-a"); a plain list of the tokens gave the same hashes.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvcli.store.enginehash import ENGINE_HASHES, VLLM_ERAS, LoraAdapter, block_hashes, hash_scheme, vllm_era
from kvcli.store.hashing import chunk_hashes, namespace_root

P40 = list(range(1000, 1040))  # 2 full blocks of 16 and 8 tokens over
BIG = [2**32 - 1 - i for i in range(40)]  # ids at the top of uint32 (pickle and CBOR widen their ints)
P600 = [(i * 7919) % 150000 for i in range(600)]  # 2 full LMCache chunks of 256 and 88 tokens over

GOLDEN = [
    ('vllm-sha256', P40, 16, '', None, [
        '9d9c413731095d0ee811a14814414907cafccd751ce2052f659e8e1f547aeb68',
        '6eab5151ee783ec014728198ae09f5b0c20f18673ff098bcec4f29beb1e71e61',
    ]),
    ('vllm-sha256', BIG, 16, '', None, [
        '068c23208c4eb76275fa746e0a746f6098e32d290630be893d8088d059eae3b8',
        '4ddb5312c0b676f34def532cb3e96b695eaeb4e162d9ecf442b48b383d8f6ec2',
    ]),
    ('vllm-sha256', P40, 16, 'tenant-a', None, [
        '4840b13a4df1932aa9c7ee836986a9307aa3011e1da278e90b38267a56bbe22d',
        '21d1a80e3f5be6a530f7092b00e3dd90388d2014623f1f25814826d3dedebe9e',
    ]),
    ('vllm-sha256_cbor', P40, 16, '', None, [
        '15528b726efb88cb4d9efc583657a821bceb1f67307c6e813417567050a24fdc',
        'b057b31190789434ae1b5f233801e9a318f5a49e9baf90762102e4d3c29c9005',
    ]),
    ('vllm-sha256_cbor', BIG, 16, '', None, [
        '6245fdbb7287560f18c1ac2b19a613fcccaf12213c0cdfc6a8df65a8e36291d4',
        'e2691a2fb9b7796f48f93e5cdd7b6b1eae77415cd15233f04f5ef6b8769a5adb',
    ]),
    ('vllm-sha256_cbor', P40, 16, 'tenant-a', None, [
        'cfba8387178753959571c517c1189716ba950c07f59532f9fbd84604dacc778d',
        '5a6df34c39017b0c9e12d5d064c4bf760b402dadd4240f9a2109235aa3b7f740',
    ]),
    ('vllm-sha256', P40, 16, '', '42', [
        'c066f06e34db5c73ef4051801d117ec365ccc55cb2c7fe43834131d0f4d6a549',
        '6d04bec6e6c8013d7168f015a24e42ec6c9e082193e4419e909a1796e260622b',
    ]),
    ('vllm-sha256_cbor', P40, 16, '', '42', [
        '8bc90083e256e33ce5412b0cf36581760664c7249eca7d0cb95d139f9a1123c8',
        'f163e413f12b0dc6df17b097f07a65f027947b809ac2c799b913759491545982',
    ]),
    ('vllm-xxhash', P40, 16, '', '42', [
        '8f5796bbe9ef1e0583710a5bf0d7fa36',
        '5b4e9cdfe48037fff492a2d355c44920',
    ]),
    ('vllm-xxhash', BIG, 16, '', '42', [
        '49166a7b90d47ff9abda54dddc8f94ee',
        '4d428d3d549ea7661dc91c84cebe7f76',
    ]),
    ('vllm-xxhash', P40, 16, 'tenant-a', '42', [
        'c443cd82fb825eaa0ec3f27a261796ca',
        '2104e2ccd0caeaf271220283abf6876b',
    ]),
    ('vllm-xxhash_cbor', P40, 16, '', '42', [
        '872809b309cff0e453bb4aca85d14c8c',
        '483d6bfe4e5f160b3c8c1c6a0f01f6b2',
    ]),
    ('vllm-xxhash_cbor', BIG, 16, '', '42', [
        '1a954e26164ead512f5c66ccf97407b2',
        '3d8faa2c737facb560c0400fdccb8478',
    ]),
    ('vllm-xxhash_cbor', P40, 16, 'tenant-a', '42', [
        '0c87f881c8a8dada979f3c5bf2028fa6',
        '5c858a678044fe2c69f1e45e259cefb3',
    ]),
    ('lmcache', P40, 16, '', '42', [
        '690bc0a53ec38254',
        '26d2b175e92d7e93',
    ]),
    ('lmcache', BIG, 16, '', '42', [
        '4c9c2d1fdbe84402',
        '3d10ecc06f6f0609',
    ]),
    ('lmcache', P600, 256, '', '42', [
        '-118a25af22f9b07a',
        '-51ffb7cca054793a',
    ]),
    ('lmcache', P40, 16, '', '0', [
        '1d0318be153aea15',
        '2b3b16f2096c4327',
    ]),
    ('lmcache-sha256', P40, 16, '', None, [
        '15e09b1b4e47d4b0',
        'ce86dfefa1117358',
    ]),
    ('lmcache-sha256_cbor', P40, 16, '', None, [
        '1e58ae2d852b6187',
        'c36c263b3d88dc2f',
    ]),
    ('lmcache-sha256_cbor', BIG, 16, '', '42', [
        'cb59e9ddce6b549e',
        '70c2e429d4a173f6',
    ]),
    ('lmcache-xxhash', P40, 16, '', '42', [
        '33ef69ade96d26a0',
        'efb4224ffa386cd0',
    ]),
    ('lmcache-xxhash_cbor', P40, 16, '', '42', [
        '2c6398bc82cbd8ef',
        'c8e47e34b1f567e0',
    ]),
    ('sglang', P40, 16, '', None, [
        '4faa8bd53eda3d89d365baa1cce7abcbe618600132b7664d8cccf18db778a47c',
        'fc228fb55a288afeb5f7d93117caa44931dc430d6ecf7fcfa3c029ac60e0c6b6',
    ]),
    ('sglang', BIG, 16, '', None, [
        'e1b0d120ba1187cb6b027afb0f3787a210a034641ef560b2e1ce3a0c339a573a',
        '511ac3e0ba06c2aa1a4bf2568ac5d5d52064e5eb8f0121d329d908a673c03b53',
    ]),
    ('sglang', P40, 16, 'tenant-a', None, [
        'e49501d3bfab61b655f128c49fedca8019eb2486c4ab0f42e784b6792ec0124c',
        '2ba20bee66b06129c1eda3b02073618f663763a5912d366b7bf3dedc16dad6d6',
    ]),
]


@pytest.mark.parametrize("scheme,tokens,block_size,salt,seed,expected", GOLDEN,
                         ids=[f"{g[0]}-{len(g[1])}-{g[2]}-{g[3] or 'nosalt'}-{g[4]}" for g in GOLDEN])
def test_matches_the_engines_own_hashes(scheme, tokens, block_size, salt, seed, expected):
    got = block_hashes(scheme, np.array(tokens, dtype="<u4"), block_size, cache_salt=salt, hash_seed=seed)
    assert got == expected


def test_vllm_is_vllms_default_sha256():
    tokens = np.array(P40, dtype="<u4")
    assert block_hashes("vllm", tokens, 16) == block_hashes("vllm-sha256", tokens, 16)
    assert block_hashes("lmcache", tokens, 16, hash_seed="7") != block_hashes("lmcache-sha256", tokens, 16)


def test_the_unset_seed_of_sha256_is_vllms_fixed_default():
    import hashlib
    import pickle

    def sha256(value) -> bytes:  # vLLM's sha256: the digest of the value's pickle, protocol 5
        return hashlib.sha256(pickle.dumps(value, protocol=5)).digest()

    tokens = np.array(P40, dtype="<u4")
    root = sha256("vllm-none-hash")  # NONE_HASH with PYTHONHASHSEED unset
    first = sha256((root, tuple(int(t) for t in P40[:16]), None))
    assert block_hashes("vllm", tokens, 16)[0] == first.hex()
    assert block_hashes("vllm", tokens, 16) != block_hashes("vllm", tokens, 16, hash_seed="42")
    with pytest.raises(ValueError, match="PYTHONHASHSEED must be 'random' or an integer"):
        block_hashes("vllm", tokens, 16, hash_seed="vllm-none-hash")  # no PYTHONHASHSEED Python would start with


def test_kvcli_is_the_stores_own_chain():
    tokens = np.array(P40, dtype="<u4")
    root = namespace_root("m", "tok", "s")
    assert block_hashes("kvcli", tokens, 16, cache_salt="s", model_id="m", tokenizer="tok") == [
        h.hex() for h in chunk_hashes(tokens, 16, root)[1]]


@pytest.mark.parametrize("scheme", ENGINE_HASHES)
def test_only_full_blocks_are_hashed(scheme):
    seed = "1"
    assert block_hashes(scheme, np.arange(15, dtype="<u4"), 16, hash_seed=seed) == []
    assert block_hashes(scheme, np.array([], dtype="<u4"), 16, hash_seed=seed) == []
    whole = block_hashes(scheme, np.arange(32, dtype="<u4"), 16, hash_seed=seed)
    assert len(whole) == 2
    assert block_hashes(scheme, np.arange(47, dtype="<u4"), 16, hash_seed=seed) == whole


@pytest.mark.parametrize("scheme", ENGINE_HASHES)
def test_the_chain_names_the_prefix(scheme):
    a = block_hashes(scheme, np.array(P40, dtype="<u4"), 16, hash_seed="1")
    b = block_hashes(scheme, np.array(P40[:16] + P40[16:][::-1], dtype="<u4"), 16, hash_seed="1")
    c = block_hashes(scheme, np.array(P40[16:32] + P40[16:32], dtype="<u4"), 16, hash_seed="1")
    assert a[0] == b[0] and a[1] != b[1]  # equal first blocks, equal first hashes
    assert c[1] != a[1]  # an equal second block under another first block is another hash


@pytest.mark.parametrize("scheme", ["kvcli", "vllm", "vllm-sha256_cbor", "vllm-xxhash", "vllm-xxhash_cbor",
                                    "sglang"])
def test_the_cache_salt_changes_every_hash(scheme):
    tokens = np.array(P40, dtype="<u4")
    plain = block_hashes(scheme, tokens, 16, hash_seed="1")
    salted = block_hashes(scheme, tokens, 16, cache_salt="t", hash_seed="1")
    assert all(p != s for p, s in zip(plain, salted))


def test_lmcache_leaves_the_salt_out():
    tokens = np.array(P40, dtype="<u4")
    assert block_hashes("lmcache", tokens, 16, cache_salt="t", hash_seed="1") == block_hashes(
        "lmcache", tokens, 16, hash_seed="1")


@pytest.mark.parametrize("scheme", ["vllm-xxhash", "vllm-xxhash_cbor", "lmcache", "lmcache-xxhash",
                                    "lmcache-xxhash_cbor"])
def test_a_random_root_needs_the_seed(scheme):
    with pytest.raises(ValueError, match="pass the PYTHONHASHSEED the engine ran with"):
        block_hashes(scheme, np.array(P40, dtype="<u4"), 16)


@pytest.mark.parametrize("seed", ["random", "-1", "4294967296", "x"])
def test_lmcache_takes_only_seeds_python_takes(seed):
    with pytest.raises(ValueError):
        block_hashes("lmcache", np.array(P40, dtype="<u4"), 16, hash_seed=seed)


def test_bad_arguments():
    with pytest.raises(ValueError, match="choose one of: kvcli, vllm"):
        block_hashes("vllm-md5", np.array(P40, dtype="<u4"), 16)
    with pytest.raises(ValueError, match="block size"):
        block_hashes("vllm", np.array(P40, dtype="<u4"), 0)



def _golden_rows() -> tuple[dict, list[dict]]:
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).parent / "data" / "vllm_hashes" / "golden.json").read_text())
    return data["lora"], data["rows"]


_LORA, _ROWS = _golden_rows()
P40_31 = list(range(1000, 1040))
BIG_31 = [2**31 - 1 - i for i in range(40)]  # the vectors' BIG: below 2**31 (vLLM 0.34.0's token buffer is int32)


@pytest.mark.parametrize("row", _ROWS, ids=[f"{r['version']}-{r['algo']}-{r['tokens']}-{r['cache_salt'] or 'nosalt'}-"
                                            f"{'lora' if r['lora'] else 'base'}-{r['hash_seed']}" for r in _ROWS])
def test_each_vllm_version_matches_its_own_code(row):
    # the vectors of tests/store/data/vllm_hashes (README.md there: each version's own hashing code, run)
    lora = LoraAdapter(_LORA["lora_name"], _LORA["lora_int_id"], _LORA["lora_path"]) if row["lora"] else None
    scheme = f"vllm-{row['algo']}@{row['version']}"
    tokens = np.array(P40_31 if row["tokens"] == "P40" else BIG_31, dtype="<u4")
    kwargs = {"cache_salt": row["cache_salt"], "hash_seed": row["hash_seed"], "lora": lora}
    if row["hashes"] == "random":
        with pytest.raises(ValueError, match="random"):
            block_hashes(scheme, tokens, row["block_size"], **kwargs)
    else:
        assert block_hashes(scheme, tokens, row["block_size"], **kwargs) == row["hashes"]


def test_the_vectors_cover_every_era_and_algorithm():
    covered = {(vllm_era(r["version"]), r["algo"]) for r in _ROWS}
    assert covered == {(era, algo) for era in VLLM_ERAS for algo in era.algos}


def test_a_version_hashes_as_its_era():
    tokens = np.array(P40, dtype="<u4")
    assert block_hashes("vllm@0.20.0", tokens, 16, hash_seed="42") == block_hashes("vllm@0.13.0", tokens, 16,
                                                                                    hash_seed="42")
    assert block_hashes("vllm", tokens, 16) == block_hashes("vllm-sha256@0.33.0", tokens, 16)
    # 0.30.0 puts the salt in bare, 0.31.0 as ("cache_salt", salt): the same prompt, other hashes
    assert block_hashes("vllm@0.30.0", tokens, 16, cache_salt="t") != block_hashes("vllm@0.31.0", tokens, 16,
                                                                                    cache_salt="t")
    assert block_hashes("vllm@0.30.0", tokens, 16) == block_hashes("vllm@0.31.0", tokens, 16)


def test_the_int_era_hashes_by_hand():
    import hashlib
    import pickle

    def sha256_int(value) -> int:  # vLLM 0.9.2's sha256: the pickle's SHA-256 digest as a big-endian int
        return int.from_bytes(hashlib.sha256(pickle.dumps(value, protocol=5)).digest(), "big")

    root = sha256_int("42")  # NONE_HASH = sha256(PYTHONHASHSEED)
    first = sha256_int((root, tuple(P40[:16]), ("t",)))  # the salt, bare, in block 0's extra keys
    second = sha256_int((first, tuple(P40[16:32]), None))
    got = block_hashes("vllm-sha256@0.9.2", np.array(P40, dtype="<u4"), 16, cache_salt="t", hash_seed="42")
    assert got == [format(first, "x"), format(second, "x")]


@pytest.mark.parametrize("scheme,label,hashes_as", [
    ("vllm", "vllm-sha256@0.33.0 (vLLM 0.31.0 to 0.34.0 hash alike)", "0.31.0 to 0.34.0"),
    ("vllm-xxhash@0.20.1", "vllm-xxhash@0.20.1 (vLLM 0.13.0 to 0.28.0 hash alike)", "0.13.0 to 0.28.0"),
    ("vllm@0.8.5", None, None),
    ("vllm-sha256@0.8.5", "vllm-sha256@0.8.5", "0.8.5"),
    ("sglang", "sglang@0.5.23", "0.5.23"),
    ("lmcache-sha256", "lmcache-sha256@0.5.6 (on vLLM 0.33.0)", "0.5.6"),
    ("kvcli", "kvcli", ""),
])
def test_every_scheme_names_its_version(scheme, label, hashes_as):
    if label is None:
        with pytest.raises(ValueError, match="builtin hash"):
            hash_scheme(scheme)
        return
    resolved = hash_scheme(scheme)
    assert resolved.label == label and resolved.hashes_as == hashes_as


@pytest.mark.parametrize("scheme,message", [
    ("vllm@0.35.0", "newer than the newest version kvcli checked"),
    ("vllm@0.7.3", "builtin hash"),
    ("vllm@banana", "X.Y.Z"),
    ("vllm-xxhash@0.12.0", "has no xxhash hash"),
    ("sglang@0.5.23", "unknown hash scheme"),
    ("vllm@", "unknown hash scheme"),
])
def test_bad_versions(scheme, message):
    with pytest.raises(ValueError, match=message):
        block_hashes(scheme, np.array(P40, dtype="<u4"), 16, hash_seed="1")


def test_lora_is_vllms_alone():
    with pytest.raises(ValueError, match="no LoRA"):
        block_hashes("sglang", np.array(P40, dtype="<u4"), 16, lora=LoraAdapter("a", 1, "/a"))
