#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with ASan + UBSan) and runs each for a bounded time on
# its seed corpus (fuzz/corpus/<target>/); fails when any target finds a crash, a leak, a timeout
# or an out-of-memory input. New inputs go to the build directory, never into the source tree.
#
#   scripts/fuzz.sh                 # every target, FUZZ_SECONDS (default 30) each
#   scripts/fuzz.sh fuzz_config     # some targets
#   FUZZ_SECONDS=600 scripts/fuzz.sh fuzz_tokenizer
#   scripts/fuzz.sh --replay DIR... # run the fuzzers once over saved inputs (no fuzzing)
# The reproducers saved under fuzz/crashes/<target>/ are replayed first on every run: a defect
# found once stays a failing test until it is fixed.
# Environment: FUZZ_SECONDS, FUZZ_BUILD_DIR (default build/fuzz), FUZZ_JOBS (build jobs, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${FUZZ_BUILD_DIR:-build/fuzz}
seconds=${FUZZ_SECONDS:-30}
jobs=${FUZZ_JOBS:-2}

if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: SKIPPED: clang++ not found (install clang and libclang-rt-14-dev: scripts/install_deps.sh)" >&2
  exit 0
fi

replay=()
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --replay) shift; replay=("$@"); break ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done

launcher=()
if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S fuzz -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" >/dev/null
fi
cmake --build "$build" -j "$jobs"

if [ ${#targets[@]} -eq 0 ]; then
  for f in "$build"/bin/fuzz_*; do targets+=("$(basename "$f")"); done
fi
[ ${#targets[@]} -gt 0 ] || { echo "fuzz: no fuzz targets were built" >&2; exit 1; }

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# A fixed seed (FUZZ_SEED) makes a run repeatable: the test suite explores the same inputs every
# time, so it fails on a defect in the code, not on the luck of the draw; change it to explore anew.
common=(-rss_limit_mb=2048 -timeout=10 -print_final_stats=0 -seed="${FUZZ_SEED:-1}")

failed=()
for t in "${targets[@]}"; do
  exe="$build/bin/$t"
  [ -x "$exe" ] || { echo "fuzz: unknown target '$t' (built: $(ls "$build/bin" | tr '\n' ' '))" >&2; exit 1; }
  name=${t#fuzz_}
  dict=()
  if [ -f "fuzz/dict/$name.dict" ]; then dict=(-dict="fuzz/dict/$name.dict"); fi
  mkdir -p "$build/artifacts" "$build/corpus/$name"
  if [ ${#replay[@]} -gt 0 ]; then
    echo "== $t: replaying ${replay[*]}"
    inputs=()
    for d in "${replay[@]}"; do
      if [ -d "$d" ]; then
        while IFS= read -r -d '' f; do inputs+=("$f"); done < <(find "$d" -type f -print0)
      elif [ -f "$d" ]; then inputs+=("$d"); fi
    done
    [ ${#inputs[@]} -gt 0 ] || continue
    "$exe" "${common[@]}" "${inputs[@]}" || failed+=("$t")
    continue
  fi
  # Saved reproducers (fuzz/crashes/<target>/) are regression inputs: each must now run clean.
  if [ -d "fuzz/crashes/$name" ] && [ -n "$(ls -A "fuzz/crashes/$name")" ]; then
    echo "== $t: replaying fuzz/crashes/$name"
    for f in "fuzz/crashes/$name"/*; do
      if ! "$exe" "${common[@]}" "$f" >"$build/artifacts/$t.replay.log" 2>&1; then
        failed+=("$t")
        grep -E "runtime error|ERROR: AddressSanitizer|invariant violated|escaped|unexpected exception|SUMMARY" \
          "$build/artifacts/$t.replay.log" | head -3 >&2
        echo "fuzz: $t: reproducer $f still crashes" >&2
      fi
    done
  fi
  echo "== $t: ${seconds}s on fuzz/corpus/$name"
  log="$build/artifacts/$t.log"
  if "$exe" "${common[@]}" "${dict[@]}" -max_total_time="$seconds" \
       -artifact_prefix="$build/artifacts/$t-" "$build/corpus/$name" "fuzz/corpus/$name" \
       >"$log" 2>&1; then
    grep -E "^#[0-9]+ *DONE|Done [0-9]+ runs" "$log" | tail -1 || true
  else
    failed+=("$t")
    tail -n 60 "$log" >&2
    echo "fuzz: $t FAILED; reproducer: $(ls -t "$build/artifacts/$t-"* 2>/dev/null | head -1)" >&2
    echo "      rerun: $root/$exe <reproducer>" >&2
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: $(printf "%s\n" "${failed[@]}" | sort -u | tr "\n" " ")" >&2
  exit 1
fi
echo "fuzz: ok (${targets[*]})"
