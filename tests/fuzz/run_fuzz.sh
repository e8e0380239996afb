#!/usr/bin/env bash
# Builds the safetensors libFuzzer target (clang, ASan + UBSan, library instrumented) in build-fuzz
# and fuzzes a copy of the seed corpus for SECONDS (default 60). Exits non-zero on any finding;
# the crashing input is kept in build-fuzz/fuzz-artifacts/.
# Usage: tests/fuzz/run_fuzz.sh [SECONDS]
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$root/build-fuzz"
artifacts="$build/fuzz-artifacts"

# Only the fuzzer is built; the test and bench targets are configured but never compiled here.
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCUBEVEC_FUZZ=ON -DCUBEVEC_TESTS=ON -DCUBEVEC_BENCH=OFF \
  -DCUBEVEC_SANITIZE=fuzzer-no-link,address,undefined
cmake --build "$build" --target safetensors_fuzzer -j 2

# libFuzzer adds what it finds to the corpus directory: keep the checked-in seeds untouched.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$root/tests/fuzz/corpus" "$work/corpus"
mkdir -p "$artifacts"

status=0
"$build/tests/fuzz/safetensors_fuzzer" "$work/corpus" \
  -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -dict="$root/tests/fuzz/safetensors.dict" -artifact_prefix="$artifacts/" -print_final_stats=1 || status=$?

if [ "$status" -ne 0 ]; then
  echo "run_fuzz.sh: the fuzzer failed (status $status); inputs in $artifacts/" >&2
  exit "$status"
fi
echo "run_fuzz.sh: no findings in ${seconds}s"
