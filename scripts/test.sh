#!/usr/bin/env bash
# The whole test suite on a fresh machine: install what is missing, build the CPU debug preset with
# AddressSanitizer + UBSan, and run every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
cmake --preset debug-asan >/dev/null
cmake --build --preset debug-asan
ctest --preset debug-asan -j "$(nproc)"
# The parsers of untrusted input under libFuzzer (clang, ASan + UBSan), FUZZ_SECONDS (30) per target.
./scripts/fuzz.sh
