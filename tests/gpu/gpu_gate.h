// What every GPU test's main() decides before it runs its GPU tests: run them, skip them (exit
// code 77, which ctest reports as skipped) or fail. Skipped only when this machine has no CUDA
// device (the runtime's cudaErrorNoDevice, or no NVIDIA driver installed at all) or the build
// has no CUDA; any other CUDA error (a driver older than the runtime, a driver / kernel module
// mismatch, a stub libcuda, a device that does not answer) is a failure that names the error, so
// a GPU machine with a broken driver does not pass by skipping. TANDEM_REQUIRE_GPU=1 (set by the
// GPU machine's scripts, docs/development.md) makes "no device" and "no CUDA" failures too.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#ifdef TANDEM_HAVE_CUDA
#include "ops/cuda/cuda_info.h"
#endif

namespace tandem::test {

enum class GpuVerdict { kRun, kSkip, kFail };

struct GpuGate {
  GpuVerdict verdict = GpuVerdict::kSkip;
  std::string why;  // kSkip / kFail: one line
};

inline bool gpu_required() {
  const char* v = std::getenv("TANDEM_REQUIRE_GPU");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

inline GpuGate gpu_gate() {
  GpuGate g;
#ifndef TANDEM_HAVE_CUDA
  g.why = "built without CUDA";
#else
  const CudaStatus s = cuda_status();
  switch (s.presence) {
    case CudaPresence::kDevices:
      g.verdict = GpuVerdict::kRun;
      return g;
    case CudaPresence::kNoDevice:
      g.why = s.detail;
      break;
    case CudaPresence::kError:
      g.verdict = GpuVerdict::kFail;
      g.why = "CUDA is unusable: " + s.detail;
      return g;
  }
#endif
  if (gpu_required()) {
    g.verdict = GpuVerdict::kFail;
    g.why += " (TANDEM_REQUIRE_GPU is set)";
  }
  return g;
}

// main()'s exit code when the gate did not say kRun (host_failed: tests that ran without a
// device failed); prints the reason on stdout, where ctest's log shows it.
inline int gpu_gate_exit(const GpuGate& g, bool host_failed = false) {
  if (g.verdict == GpuVerdict::kFail) {
    std::printf("FAILED: gpu tests: %s\n", g.why.c_str());
    return 1;
  }
  if (host_failed) return 1;
  std::printf("gpu tests: %s, skipped\n", g.why.c_str());
  return 77;
}

// A gpu test's main(): every test on a usable GPU; elsewhere only the tests `host_filter` names (a
// gtest filter of checks that need no device; nullptr: none), then gpu_gate_exit's code.
inline int gpu_test_main(int argc, char** argv, const char* host_filter = nullptr) {
  const GpuGate gate = gpu_gate();
  testing::InitGoogleTest(&argc, argv);
  if (gate.verdict == GpuVerdict::kRun) return RUN_ALL_TESTS();
  if (host_filter == nullptr) return gpu_gate_exit(gate);
  GTEST_FLAG_SET(filter, host_filter);
  return gpu_gate_exit(gate, RUN_ALL_TESTS() != 0);
}

}  // namespace tandem::test
