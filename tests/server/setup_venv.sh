#!/usr/bin/env bash
# The live API tests' venv (ctest: ServerApi.Setup, a FIXTURES_SETUP test): pytest, the official
# `openai` client, httpx-sse, tokenizers (to name token ids) and jsonschema (to check structured
# outputs) from PyPI, pinned. Needs python3 with venv and PyPI access; without
# them it fails with a message and ctest does not run the API tests (never a silent skip).
# Usage: setup_venv.sh VENV_DIR
set -euo pipefail
venv=${1:?usage: setup_venv.sh VENV_DIR}
pins=(openai==1.58.1 httpx==0.27.2 httpx-sse==0.4.0 pytest==8.3.4 tokenizers==0.22.2 jsonschema==4.23.0)

have_pins() {
  "$venv/bin/python" - "${pins[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(any(version(p.split("==")[0]) != p.split("==")[1] for p in sys.argv[1:]))
PY
}
if have_pins; then exit 0; fi
rm -rf "$venv"
if ! python3 -m venv "$venv"; then
  echo "error: 'python3 -m venv $venv' failed: the server API tests need python3 with venv" >&2
  exit 1
fi
if ! "$venv/bin/pip" install --disable-pip-version-check --quiet --retries 2 --timeout 30 "${pins[@]}"; then
  echo "error: pip could not install ${pins[*]} from PyPI (no network access?);" \
       "the ServerApi tests need them" >&2
  exit 1
fi
