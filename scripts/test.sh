#!/usr/bin/env bash
# The whole test suite on a fresh machine: install what is missing, build the CPU debug preset with
# AddressSanitizer + UBSan (-O1 -g1: the line tables the sanitizers' stack traces print, at about
# two thirds of -g's compile time), and run every test with ctest, one BLAS thread each; then the
# fuzzers; then, where a CUDA toolkit is installed, compile the CUDA build's own targets: the CUDA
# backend, its tests (they need a GPU: scripts/gpu_tests.sh), the CLI and the benchmarks (the CPU
# tests were built and run above).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
cmake --preset debug-asan >/dev/null
cmake --build --preset debug-asan
ctest --preset debug-asan -j "$(nproc)"
# The parsers of untrusted input under libFuzzer (clang, ASan + UBSan), FUZZ_SECONDS (30) per target.
./scripts/fuzz.sh
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  cmake --preset cuda -DDSI_SERVER=OFF >/dev/null
  cmake --build --preset cuda --target dsinfer_cuda_tests dsinfer dsinfer_benches
else
  echo "test.sh: no CUDA toolkit (nvcc) here, so the CUDA build was not compiled"
fi
