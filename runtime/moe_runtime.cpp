#include "runtime/moe_runtime.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/thread_pool.h"

namespace tandem {

struct MoeRuntime::Impl {
  std::unique_ptr<MoeBackend> cpu;  // the CPU MoE backend
};

namespace {

// The CPU side: experts as the kernels read them and the backend that runs them.
std::unique_ptr<MoeBackend> make_cpu_backend(const LoadedModel& model, const BackendOptions& o,
                                             ThreadingContext& threading, std::string* summary) {
  if (o.cpu_experts != "native") {
    fail(ErrorKind::kInvalidArgument, "--cpu-experts '{}' is not available yet", o.cpu_experts);
  }
  *summary = "CPU experts: native (reference backend)";
  return std::make_unique<CpuMoeBackend>(&threading.pool());
}

}  // namespace

MoeRuntime::MoeRuntime(const LoadedModel& model, const BackendOptions& o,
                       ThreadingContext& threading)
    : impl_(std::make_unique<Impl>()) {
  impl_->cpu = make_cpu_backend(model, o, threading, &summary_);
  backend_ = impl_->cpu.get();
  if (o.accel != "auto" && o.accel != "none") {
    fail(ErrorKind::kInvalidArgument, "--accel '{}' is not available yet", o.accel);
  }
}

MoeRuntime::~MoeRuntime() = default;

}  // namespace tandem
