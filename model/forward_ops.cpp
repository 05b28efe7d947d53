// ForwardOps' defaults (model/forward_ops.h): what ops without linear attention, stream order or
// graphs answer when asked for them.
#include "model/forward_ops.h"

#include "core/error.h"

namespace tandem {

void ForwardOps::linear_attention(int64_t, const float*, float*) {
  fail(ErrorKind::kUnsupported, "{} forward ops: no Gated DeltaNet (linear-attention) layers",
       name());
}

float* ForwardOps::host_buffer(HostSlot, int64_t) {
  fail(ErrorKind::kInternal, "{} forward ops: host_buffer on ops that are not stream-ordered",
       name());
}
void ForwardOps::copy_to_host(const float*, int64_t, float*) {
  fail(ErrorKind::kInternal, "{} forward ops: copy_to_host on ops that are not stream-ordered",
       name());
}
void ForwardOps::host_work(std::function<void()>) {
  fail(ErrorKind::kInternal, "{} forward ops: host_work on ops that are not stream-ordered",
       name());
}

namespace {
[[noreturn]] void no_graphs(const ForwardOps& ops, const char* what) {
  fail(ErrorKind::kInternal, "{} forward ops: {} on ops without graphs", ops.name(), what);
}
}  // namespace

void ForwardOps::stage(const ForwardStep&, KvCache&) {
  no_graphs(*this, "stage");
}
void ForwardOps::begin_capture() {
  no_graphs(*this, "begin_capture");
}
int ForwardOps::end_capture() {
  no_graphs(*this, "end_capture");
}
void ForwardOps::launch_graph(int) {
  no_graphs(*this, "launch_graph");
}
void ForwardOps::drop_graph(int) {
  no_graphs(*this, "drop_graph");
}
void ForwardOps::lm_head_to_host(const std::vector<int64_t>&, const float*, float*) {
  no_graphs(*this, "lm_head_to_host");
}

}  // namespace tandem
