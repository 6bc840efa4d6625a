#!/usr/bin/env bash
# The chat-template oracle's setup (ctest: JinjaOracle.Setup, a FIXTURES_SETUP test): a venv in the
# build directory with the pinned jinja2 from PyPI, then oracle.py writes OUT_DIR/oracle.json for the
# JinjaParity.* tests. The venv sees the system's site-packages, so a system jinja2 of the pinned
# version is used as is (no network needed); otherwise pip installs it. Without python3 (with venv)
# or PyPI access the setup fails with a message, and ctest does not run the parity tests.
# Usage: run_oracle.sh OUT_DIR
set -euo pipefail
version=3.1.6  # jinja2 on PyPI (transformers renders chat templates with it)
out=${1:?usage: run_oracle.sh OUT_DIR}
src=$(cd "$(dirname "$0")/../.." && pwd)
venv=$out/venv
mkdir -p "$out"

have_version() {
  "$venv/bin/python" -c "import sys, jinja2; sys.exit(jinja2.__version__ != '$version')" 2>/dev/null
}
if ! have_version; then
  rm -rf "$venv"
  if ! python3 -m venv --system-site-packages "$venv"; then
    echo "error: 'python3 -m venv $venv' failed: the jinja2 oracle needs python3 with venv" >&2
    exit 1
  fi
  if ! have_version; then
    if ! "$venv/bin/pip" install --disable-pip-version-check --quiet --retries 2 --timeout 30 \
        "jinja2==$version"; then
      echo "error: pip could not install jinja2==$version from PyPI (no network access?);" \
           "the JinjaParity tests need it as their oracle" >&2
      exit 1
    fi
  fi
fi
"$venv/bin/python" "$src/tests/jinja/oracle.py" --source-dir "$src" --out "$out/oracle.json"
