#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in their own tree and runs each one over its seed
# corpus (tests/data/fuzz/<target>/) for N seconds. Exits non-zero when a fuzzer finds a crash,
# a leak, a hang or an allocation over the limit; the input is then in
# <build>/fuzz-artifacts/<target>/. Keep such inputs in tests/data/fuzz/regressions/<target>/ once
# fixed: they are replayed first here and by the unit test formats_fuzz_regression_test.
#
#   tests/fuzz/run_fuzzers.sh [seconds per target, default 60] [target ...]
#   env: TANDEM_FUZZ_BUILD (default <repo>/build-fuzz), TANDEM_FUZZ_JOBS (build -j, default 1)
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
seconds="${1:-60}"
shift || true
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] &&
  targets=(gguf safetensors safetensors_index hf_config jinja trace residuals placement
    openai_request chat_output)
build="${TANDEM_FUZZ_BUILD:-$repo/build-fuzz}"
jobs="${TANDEM_FUZZ_JOBS:-1}"
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -g -O1"

cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_CUDA=OFF \
  -DTANDEM_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >/dev/null
for t in "${targets[@]}"; do
  cmake --build "$build" -j "$jobs" --target "fuzz_$t"
done

status=0
for t in "${targets[@]}"; do
  seeds="$repo/tests/data/fuzz/$t"
  regressions="$repo/tests/data/fuzz/regressions/$t"
  corpus="$build/fuzz-corpus/$t"
  artifacts="$build/fuzz-artifacts/$t/"
  mkdir -p "$corpus" "$artifacts"
  limits=(-rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 -max_len=16384)
  # Replay the known crashers first: a regression must stay fixed.
  if [[ -d "$regressions" ]] && compgen -G "$regressions/*" >/dev/null; then
    echo "== $t: replaying regressions"
    "$build/tests/fuzz/fuzz_$t" "${limits[@]}" "$regressions"/* || status=1
  fi
  echo "== $t: fuzzing for ${seconds}s"
  dirs=("$corpus")
  [[ -d "$seeds" ]] && dirs+=("$seeds")
  # The chat templates of real models seed the Jinja target.
  [[ $t == jinja ]] && dirs+=("$repo/tests/data/templates")
  ASAN_OPTIONS=detect_leaks=1 "$build/tests/fuzz/fuzz_$t" "${limits[@]}" \
    -max_total_time="$seconds" -print_final_stats=1 -print_funcs=0 \
    -artifact_prefix="$artifacts" "${dirs[@]}" \
    || status=1
done
exit $status
