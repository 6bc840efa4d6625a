#!/usr/bin/env bash
# The tokenizer oracle's setup (ctest: TokenizerOracle.Setup, a FIXTURES_SETUP test): a venv in the
# build directory with the pinned Hugging Face `tokenizers` from PyPI, then oracle.py writes
# OUT_DIR/oracle.json for the TokenizerParity.* tests. Needs python3 (with venv) and PyPI access:
# without them it fails, and ctest then does not run the parity tests (it never skips silently).
# Usage: run_oracle.sh OUT_DIR
set -euo pipefail
version=0.22.2  # tokenizers on PyPI
out=${1:?usage: run_oracle.sh OUT_DIR}
src=$(cd "$(dirname "$0")/../.." && pwd)
venv=$out/venv
mkdir -p "$out"

have_version() {
  "$venv/bin/python" -c "import sys, tokenizers; sys.exit(tokenizers.__version__ != '$version')" \
    2>/dev/null
}
if ! have_version; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    echo "error: 'python3 -m venv $venv' failed: the tokenizer oracle needs python3 with venv" >&2
    exit 1
  fi
  if ! "$venv/bin/pip" install --disable-pip-version-check --quiet --retries 2 --timeout 30 \
      "tokenizers==$version"; then
    echo "error: pip could not install tokenizers==$version from PyPI (no network access?);" \
         "the TokenizerParity tests need it as their oracle" >&2
    exit 1
  fi
fi
"$venv/bin/python" "$src/tests/tokenizer/oracle.py" --source-dir "$src" --out "$out"
