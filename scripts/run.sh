#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build the CPU release, and generate
# from the bundled tiny GLM-5-architecture checkpoint. Extra arguments go to `dsinfer generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target dsinfer
model=tests/fixtures/glm_tiny
exec build/release/bin/dsinfer generate --model "$model" \
  --prompt-ids 70,370,348,498,71,456,75,315,101,33,17,250 --max-new-tokens 24 --ignore-eos "$@"
