#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build the CPU release, and generate
# text with the bundled trained model (models/kjv-dsa: the GLM-5 architecture with sparse attention
# and an MTP layer, trained on the King James Bible), drafting with its MTP layer.
# Extra arguments go to `dsinfer generate` (e.g. --prompt "..." to replace the default prompt).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target dsinfer
exec build/release/bin/dsinfer generate --model models/kjv-dsa --prompt "And God said" \
  --max-new-tokens 96 --temperature 0.8 --seed 1 --speculative-tokens 3 "$@"
