#include "model/moe_backend.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {

float shared_expert_gate(const float* x, const float* g, int64_t h) {
  float dot = 0.0f;
  for (int64_t i = 0; i < h; ++i) dot += x[i] * g[i];
  return 1.0f / (1.0f + std::exp(-dot));
}

void CpuMoeBackend::submit(const MoeRequest& r) {
  TD_CHECK(!pending_, "CpuMoeBackend::submit while a request is pending");
  const int64_t h = r.hidden_size;
  std::fill(r.out, r.out + r.n_tokens * h, 0.0f);
  const int64_t n_experts = static_cast<int64_t>(r.experts->gate.size());
  for (int64_t e = 0; e < n_experts; ++e) {
    if (r.run_here != nullptr && r.run_here[e] == 0) continue;
    rows_.clear();  // (token * k + slot) of every selection of e
    for (int64_t i = 0; i < r.n_tokens * r.k; ++i) {
      if (r.ids[i] == e) rows_.push_back(i);
    }
    if (rows_.empty()) continue;
    const int64_t n = static_cast<int64_t>(rows_.size());
    x_.resize(n * h);
    d_.resize(n * h);
    for (int64_t j = 0; j < n; ++j) {
      const float* src = r.hidden + (rows_[j] / r.k) * h;
      std::copy(src, src + h, x_.data() + j * h);
    }
    ops::swiglu_ffn(r.experts->gate[e], r.experts->up[e], r.experts->down[e], x_.data(), n,
                    d_.data(), pool_, &g_, &u_, r.experts->extras(e));
    for (int64_t j = 0; j < n; ++j) {
      const float w = r.weights[rows_[j]];
      float* dst = r.out + (rows_[j] / r.k) * h;
      const float* src = d_.data() + j * h;
      for (int64_t i = 0; i < h; ++i) dst[i] += w * src[i];
    }
  }
  pending_ = true;
}

void CpuMoeBackend::wait() {
  TD_CHECK(pending_, "CpuMoeBackend::wait without submit");
  pending_ = false;
}

}  // namespace tandem
