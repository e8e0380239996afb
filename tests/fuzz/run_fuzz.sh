#!/usr/bin/env bash
# Builds the libFuzzer targets and fuzzes copies of their seed corpora for SECONDS (default 60), all at once:
# the safetensors header parser (with its fast and strict paths compared), the JSON config readers
# (models, schedulers, timestep policy, device profiles) and the command line's argument parsing
# (cli_fuzzer). The fuzzers live in the clang AddressSanitizer + UBSan tree that also runs the test
# suite (BUILD_DIR, default build-asan; configured here when it is not yet a fuzzing tree), so CI
# compiles the library once for both. Exits non-zero on any finding; the input is kept in
# BUILD_DIR/fuzz-artifacts/.
# Usage: tests/fuzz/run_fuzz.sh [SECONDS] [BUILD_DIR]
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${2:-$root/build-asan}"
artifacts="$build/fuzz-artifacts"

if ! grep -qs '^CUBEVEC_FUZZ:BOOL=ON' "$build/CMakeCache.txt"; then
  "$root/.ci/configure-sanitizer-tree" "$build" address,undefined -DCUBEVEC_FUZZ=ON
fi
cmake --build "$build" --target safetensors_fuzzer config_fuzzer cli_fuzzer

# libFuzzer adds what it finds to the corpus directory: keep the checked-in seeds untouched.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$artifacts"

fuzz() {  # fuzz TARGET CORPUS [extra libFuzzer flags...]; the output goes to $work/TARGET.log
  local target="$1" corpus="$2"
  shift 2
  cp -r "$corpus" "$work/$target"
  local status=0
  "$build/tests/fuzz/$target" "$work/$target" \
    -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/$target-" -print_final_stats=1 "$@" > "$work/$target.log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    echo "run_fuzz.sh: $target failed (status $status); inputs in $artifacts/" >> "$work/$target.log"
    return "$status"
  fi
  echo "run_fuzz.sh: $target: no findings in ${seconds}s" >> "$work/$target.log"
}

# The three fuzzers run at once (CI's machines have 2 cores: SECONDS of wall time, not 3 x SECONDS);
# each one's log is printed when all are done, and any finding fails the script.
targets=(safetensors_fuzzer config_fuzzer cli_fuzzer)
fuzz safetensors_fuzzer "$root/tests/fuzz/corpus" -dict="$root/tests/fuzz/safetensors.dict" &
pids=($!)
fuzz config_fuzzer "$root/tests/fuzz/config_corpus" &
pids+=($!)
# The command line prints help and error lines: keep them out of the log (-close_fd_mask=3).
fuzz cli_fuzzer "$root/tests/fuzz/cli_corpus" -close_fd_mask=3 &
pids+=($!)
failed=0
for i in "${!targets[@]}"; do
  wait "${pids[$i]}" || failed=1
  cat "$work/${targets[$i]}.log"
done
exit "$failed"
