#!/usr/bin/env bash
# Rewrite the locks main.txt and test.txt from today's releases on PyPI (docs/dependencies.md says when and what
# to check after). Run in the project's venv, with the torch the README installs (torch's own requirements are
# read from it).
#
#   . .venv/bin/activate && bash requirements/refresh.sh
#
# The locks are universal (every platform and Python >= 3.11, with markers) and hash every file, so pip installs
# exactly these files or fails. torch is left out: the README installs it first, on its own (the CPU build here;
# a bare requirement could pull a multi-GB CUDA build), and its CPU build's requirements are locked in its place.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9  # the resolver used; bump it deliberately
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/uv" && "$tmp/uv/bin/pip" install -q "uv==$UV_VERSION"
uv="$tmp/uv/bin/uv"
# torch's requirements, without its extras and its CUDA libraries (the CPU build has none)
python - >requirements/torch-cpu.in <<'PY'
import importlib.metadata as md
print("# torch's own requirements (its CPU build's), locked in its place: made by requirements/refresh.sh")
from packaging.requirements import Requirement
for text in md.requires("torch") or []:
    req = Requirement(text)
    if "extra" in str(req.marker or "") or req.name.startswith(("nvidia-", "triton", "cuda-")):
        continue
    print(text)
PY
echo "torch; python_version < '0'" >"$tmp/no-torch.txt"  # an override whose marker never holds: torch unlocked
common=(--universal --python-version 3.11 --generate-hashes --override "$tmp/no-torch.txt" --no-header
        --index-url https://pypi.org/simple --quiet)
"$uv" pip compile "${common[@]}" pyproject.toml --extra test requirements/torch-cpu.in -o requirements/test.txt
# main.txt: the runtime set, at the versions test.txt chose
"$uv" pip compile "${common[@]}" pyproject.toml requirements/torch-cpu.in -c requirements/test.txt -o requirements/main.txt
for f in main test; do
    sed -i "1i # kvcli's $f lock: made by requirements/refresh.sh (uv $UV_VERSION) on $(date -u +%F); do not edit" \
        requirements/$f.txt
done
echo "requirements/main.txt: $(grep -c '==' requirements/main.txt) packages; requirements/test.txt: $(grep -c '==' requirements/test.txt)"
