// Device's defaults (host memory from the C allocator, no graphs, no pinning, no forward ops),
// the argument checks every device's ffn shares, and HostStaging.
#include "runtime/device.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "model/forward_ops.h"

namespace tandem::rt {

void* Device::alloc_host(uint64_t bytes) {
  if (bytes > (uint64_t(1) << 62)) {
    fail(ErrorKind::kResource, "{}: alloc_host of {} bytes: too large", name(), bytes);
  }
  const uint64_t rounded = std::max<uint64_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) {
    fail(ErrorKind::kResource, "{}: alloc_host of {} bytes: out of host memory", name(), bytes);
  }
  return p;
}

void Device::free_host(void* p) {
  std::free(p);
}

void Device::begin_capture(StreamId) {
  fail(ErrorKind::kUnsupported, "{}: no graph capture", name());
}
Device::GraphId Device::end_capture(StreamId) {
  fail(ErrorKind::kUnsupported, "{}: no graph capture", name());
}
void Device::launch_graph(GraphId, StreamId) {
  fail(ErrorKind::kUnsupported, "{}: no graphs", name());
}
void Device::destroy_graph(GraphId) {
  fail(ErrorKind::kUnsupported, "{}: no graphs", name());
}

bool Device::register_host(const void*, uint64_t, std::string*) {
  return true;
}

void Device::unregister_host(const void*) {}

void check_ffn_args(const std::string& device, const DeviceFfnWeights& w, const float* x, int64_t n,
                    const float* scale, const float* out,
                    const std::function<void(const void*, uint64_t, const char*)>& check) {
  const int64_t H = w.gate.cols(), ff = w.gate.rows(), out_cols = w.down.rows();
  if (w.up.rows() != ff || w.up.cols() != H || w.down.cols() != ff || n < 0) {
    fail(ErrorKind::kInvalidArgument,
         "{}: ffn shapes: gate [{}, {}], up [{}, {}], down [{}, {}], {} tokens", device, ff, H,
         w.up.rows(), w.up.cols(), out_cols, w.down.cols(), n);
  }
  for (const ops::Weight* m : {&w.gate, &w.up, &w.down}) check(m->t.data, 1, "ffn weight");
  check(x, static_cast<uint64_t>(n * H) * 4, "ffn input");
  check(out, static_cast<uint64_t>(n * out_cols) * 4, "ffn output");
  if (scale != nullptr) check(scale, static_cast<uint64_t>(n) * 4, "ffn scale");
  const ops::FfnExtras& e = w.extras;
  if (e.gate_bias != nullptr) check(e.gate_bias, static_cast<uint64_t>(ff) * 4, "ffn gate bias");
  if (e.up_bias != nullptr) check(e.up_bias, static_cast<uint64_t>(ff) * 4, "ffn up bias");
  if (e.down_bias != nullptr) {
    check(e.down_bias, static_cast<uint64_t>(out_cols) * 4, "ffn down bias");
  }
}

float* HostStaging::floats(int64_t count, bool* grew) {
  const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(count, 1)) * 4;
  if (grew != nullptr) *grew = bytes > bytes_;
  if (bytes > bytes_) {
    dev_->free_host(p_);
    p_ = nullptr;
    bytes_ = 0;
    p_ = dev_->alloc_host(bytes);
    bytes_ = bytes;
  }
  return static_cast<float*>(p_);
}

std::unique_ptr<ForwardOps> Device::forward_ops(std::shared_ptr<const DenseWeights>,
                                                const ForwardOpsOptions&) {
  fail(ErrorKind::kUnsupported, "the {} device has no forward ops: keep the dense part on the CPU",
       name());
}

}  // namespace tandem::rt
