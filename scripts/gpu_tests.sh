#!/usr/bin/env bash
# On a GPU host: configure the `cuda` preset, build the GPU tests (DSI_GPU_TESTS_BUILD=all builds
# every target), and run the GPU-labelled tests (the CUDA op tests: every op on the CPU reference
# and on the GPU, compared), then print a summary.
# Dependencies: the system's Debian packages, or, with DSI_DEPS_DIR set, the packages unpacked by
# scripts/offline_env.sh (no registry needed). nvcc is taken from PATH, CUDACXX or /usr/local/cuda.
#   ./scripts/gpu_tests.sh                 DSI_DEPS_DIR=/path/to/deps ./scripts/gpu_tests.sh
# Extra arguments go to ctest (e.g. -R CudaTopk).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${DSI_DEPS_DIR:-}" ]; then
  # shellcheck source=offline_env.sh
  source scripts/offline_env.sh
fi
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    if [ -x "$d/nvcc" ]; then export CUDACXX="$d/nvcc"; break; fi
  done
fi
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1; then
  echo "gpu_tests: nvcc not found (set CUDACXX or put the CUDA toolkit's bin/ on PATH)" >&2
  exit 1
fi

echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  echo "(nvidia-smi unavailable; the test binary reports the device it sees)"
echo "== toolchain: $(cmake --version | head -1); nvcc $("${CUDACXX:-nvcc}" --version | tail -1)"

echo "== configure (preset cuda)"
# GPU hosts without cpp-httplib (no package registry) build without the HTTP server.
server=ON
if ! pkg-config --exists cpp-httplib 2>/dev/null; then
  echo "(cpp-httplib not found: building without the server, chat and bench commands)"
  server=OFF
fi
cmake --preset cuda -DDSI_SERVER="$server"
echo "== build"
if [ "${DSI_GPU_TESTS_BUILD:-}" = all ]; then
  cmake --build --preset cuda -j "$(nproc)"
else
  cmake --build --preset cuda -j "$(nproc)" --target dsinfer_cuda_tests
fi

echo "== ctest -L gpu"
log="build/cuda/gpu_tests.log"
set +e
ctest --preset cuda -L gpu --output-on-failure "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

echo "== summary"
grep -E "tests passed|tests failed|Total Test time" "$log" || true
skipped=$(grep -c "Skipped" "$log" || true)
if [ "$skipped" -gt 0 ]; then
  echo "note: $skipped tests were skipped (no CUDA device visible to the test binary?)"
fi
if [ "$status" -eq 0 ]; then echo "gpu_tests: PASS"; else echo "gpu_tests: FAIL (ctest exit $status; log in $log)"; fi
exit "$status"
