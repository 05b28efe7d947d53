#!/usr/bin/env bash
# The CUDA backend's checks on a lent GPU machine (docs/development.md, "On a lent GPU machine"),
# prepared here so that one call of the device tool runs them all:
#
#   here:   scripts/gpu-check.sh pack [BUILD_DIR]      -> .devcarry/pack.tar.xz (binaries + libs)
#   there:  scripts/gpu-check.sh run tests|bench|all   -> logs and JSON under $OUT (else
#                                                         ./gpu-check-out)
#
# `run` unpacks the pack and puts the image's cuBLAS on the loader's path; `tests` runs every gpu
# test with TANDEM_REQUIRE_GPU=1 (100 s at most each, its log kept: under 9 minutes in all);
# `bench` the CUDA kernels' microbenchmarks and `tandem bench` of a DeepSeek-V2-Lite-shaped model
# cut to 4 layers (Q4_K_M, written there by `tandem synth`) with --accel cuda against --accel none
# (under 8 minutes). summary.txt has one line per step. A device call runs 10 minutes at most:
# `tests` and `bench` fit one each.
set -uo pipefail

binaries=(tandem tests/test_gpu_cuda_info_test tests/test_gpu_cuda_dequant_test
          tests/test_gpu_cuda_ops_test tests/test_gpu_cuda_delta_net_test
          tests/test_gpu_cuda_device_test tests/test_gpu_moe_stream_test
          bench/bench_cuda_dequant_bench)
pack=.devcarry/pack.tar.xz

case "${1:-}" in
  pack)
    build=${2:-build}
    mkdir -p .devcarry
    exec "$(dirname "$0")/device-pack.sh" "$build" "$pack" "${binaries[@]}"
    ;;
  run)
    what=${2:-}
    case "$what" in
      tests | bench | all) ;;
      *)
        echo "usage: $0 run tests|bench|all" >&2
        exit 2
        ;;
    esac
    ;;
  *)
    echo "usage: $0 pack [BUILD_DIR] | run tests|bench|all" >&2
    exit 2
    ;;
esac

[ -f "$pack" ] || { echo "gpu-check: no $pack (make it with: $0 pack)" >&2; exit 1; }
out=${OUT:-$PWD/gpu-check-out}
mkdir -p "$out"
tar xJf "$pack"
build=$(tar tJf "$pack" | head -1 | cut -d/ -f1)
# The tests' scratch and data paths are compiled in as /work/main/...
if [ ! -e /work/main ]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
cublas=$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$PWD/lib${cublas:+:$(dirname "$cublas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TANDEM_REQUIRE_GPU=1 TANDEM_BIN="$PWD/$build/tandem"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
note "cuBLAS: ${cublas:-not found}"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || note "nvidia-smi failed"

step() {  # step NAME LIMIT_S COMMAND...: runs it, its output in $out/NAME.log
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  note "$name: rc $rc, $((SECONDS - t0)) s"
}

if [ "$what" != bench ]; then
  for t in cuda_info_test cuda_dequant_test cuda_ops_test cuda_delta_net_test cuda_device_test \
    moe_stream_test; do
    step "$t" 100 "$build/tests/test_gpu_$t"
  done
fi
[ "$what" = tests ] && exit 0

step bench_cuda_kernels 90 "$build/bench/bench_cuda_dequant_bench" \
  --benchmark_filter='cuda_matvec|cuda_dequant/q4_k->f32' --benchmark_min_time=0.05 \
  --benchmark_out="$out/bench_cuda_kernels.json" --benchmark_out_format=json
model=/tmp/gpu-check-v2lite-4l-q4_k_m.gguf
step synth 120 "$TANDEM_BIN" synth --preset deepseek-v2-lite --layers 4 --type q4_k_m -o "$model"
step bench_v2lite_4l 240 "$TANDEM_BIN" bench -m "$model" -p 256 -n 32 -r 2 --accel cuda \
  --vs "--accel none" --json
