#include "ops/cpu/ref_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "core/error.h"
#include "core/fp_convert.h"
#include "core/thread_pool.h"
#include "formats/quant.h"

namespace tandem::ops {
namespace {

// Rows of a weight per task: enough work per task to amortize the queue, enough tasks to balance.
constexpr int64_t kRowsPerTask = 16;

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

std::vector<float>& thread_scratch() {
  thread_local std::vector<float> scratch;
  return scratch;
}

}  // namespace

Weight Weight::row_range(int64_t r0, int64_t n) const {
  Weight v = *this;
  v.t.ndim = 2;
  v.t.shape = {n, t.row_elems(), 0, 0};
  v.t.data = static_cast<char*>(t.data) + r0 * t.row_bytes();
  v.t.stride_bytes = {t.row_bytes(), static_cast<int64_t>(dtype_bytes(t.dtype, 1)), 0, 0};
  v.row0 = row0 + r0;
  return v;
}

const float* weight_row(const Weight& w, int64_t r, std::vector<float>& scratch) {
  const int64_t k = w.t.row_elems();
  if (w.t.dtype == DType::kF32 && w.scale_inv == nullptr) return w.t.row<const float>(r);
  if (static_cast<int64_t>(scratch.size()) < k) scratch.resize(k);
  float* out = scratch.data();
  dequantize_row(w.t.dtype, w.t.row<const void>(r), out, k);
  if (w.scale_inv != nullptr) {
    const float* s = w.scale_inv + ((w.row0 + r) / w.block_rows) * w.scale_cols;
    for (int64_t c = 0; c < k; ++c) out[c] *= s[c / w.block_cols];
  }
  return out;
}

void matmul(const Weight& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool) {
  const int64_t n_rows = w.rows();
  const int64_t k = w.cols();
  auto task = [&](size_t task_id) {
    std::vector<float>& scratch = thread_scratch();
    const int64_t r0 = static_cast<int64_t>(task_id) * kRowsPerTask;
    const int64_t r1 = std::min(n_rows, r0 + kRowsPerTask);
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr = weight_row(w, r, scratch);
      for (int64_t t = 0; t < n_tokens; ++t) y[t * n_rows + r] = dot(wr, x + t * k, k);
    }
  };
  const size_t n_tasks = static_cast<size_t>((n_rows + kRowsPerTask - 1) / kRowsPerTask);
  if (pool == nullptr || n_tasks == 1) {
    for (size_t i = 0; i < n_tasks; ++i) task(i);
  } else {
    pool->run(n_tasks, task);
  }
}

void matmul_transposed(const Weight& w, const float* x, int64_t n_tokens, float* y) {
  const int64_t n_rows = w.rows();
  const int64_t k = w.cols();
  std::fill(y, y + n_tokens * k, 0.0f);
  std::vector<float>& scratch = thread_scratch();
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* wr = weight_row(w, r, scratch);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float xv = x[t * n_rows + r];
      float* yt = y + t * k;
      for (int64_t j = 0; j < k; ++j) yt[j] += xv * wr[j];
    }
  }
}

void embedding(const Tensor& table, const int32_t* ids, int64_t n, float* out) {
  const int64_t rows = table.rows();
  const int64_t k = table.row_elems();
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= rows) {
      fail(ErrorKind::kOutOfRange, "token id {} at position {} is outside the vocabulary [0, {})",
           ids[i], i, rows);
    }
    dequantize_row(table.dtype, table.row<const void>(ids[i]), out + i * k, k);
  }
}

std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  const int64_t k = t.row_elems();
  for (int64_t r = 0; r < t.rows(); ++r) {
    dequantize_row(t.dtype, t.row<const void>(r), out.data() + r * k, k);
  }
  return out;
}

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

void layer_norm(const float* x, const float* w, const float* b, int64_t n, float eps,
                float* out) {
  float mean = 0.0f;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<float>(n);
  float var = 0.0f;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  const float inv = 1.0f / std::sqrt(var / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - mean) * inv * w[i] + b[i];
}

void hadamard(float* x, int64_t n) {
  for (int64_t len = 1; len < n; len *= 2) {
    for (int64_t i = 0; i < n; i += 2 * len) {
      for (int64_t j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

void index_scores(const AttentionArgs& keys, const float* q, const float* w, int64_t heads,
                  int64_t n, float* out) {
  AttentionArgs a = keys;
  a.n_tokens = 1;
  a.pos0 = n - 1;
  a.n_kv_heads = 1;
  a.dv = a.dk;
  a.v = a.k;
  a.v16 = a.k16;
  a.v8 = a.k8;
  a.v_stride = a.k_stride;
  a.v_block = a.k_block;
  std::vector<float> wq, wk, wv;
  a.q = q;
  a.q_stride = heads * a.dk;
  a.n_heads = heads;
  // The keys as F32 rows (widen_cache rounds a BF16 cache's queries; the indexer's are F32).
  AttentionArgs k32 = widen_cache(a, &wq, &wk, &wv);
  std::vector<float> dots(static_cast<size_t>(heads));
  for (int64_t s = 0; s < n; ++s) {
    const float* k = k32.k + s * k32.k_stride;
    for (int64_t h = 0; h < heads; ++h) {
      float d = 0.0f;
      for (int64_t i = 0; i < a.dk; ++i) d = std::fma(q[h * a.dk + i], k[i], d);
      dots[static_cast<size_t>(h)] = d;
    }
    out[s] = index_score(dots.data(), w, heads);
  }
}

void softmax(float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void softmax_with_sink(float* x, int64_t n, float sink) {
  float mx = sink;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  sum += std::exp(sink - mx);
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

void glu_with_extras(float* gate, const float* up, int64_t n, int64_t c0, const FfnExtras& e) {
  for (int64_t i = 0; i < n; ++i) {
    float a = gate[i] + (e.gate_bias != nullptr ? e.gate_bias[c0 + i] : 0.0f);
    float b = up[i] + (e.up_bias != nullptr ? e.up_bias[c0 + i] : 0.0f);
    if (e.limit > 0.0f) {
      a = std::min(a, e.limit);
      b = std::clamp(b, -e.limit, e.limit);
      gate[i] = a / (1.0f + std::exp(kSwigluOaiAlpha * -a)) * (b + 1.0f);
    } else {
      gate[i] = silu(a) * b;
    }
  }
}

void add_down_bias(float* y, int64_t n, int64_t r0, const FfnExtras& e) {
  if (e.down_bias == nullptr) return;
  for (int64_t i = 0; i < n; ++i) y[i] += e.down_bias[r0 + i];
}

void swiglu_ffn(const Weight& gate, const Weight& up, const Weight& down, const float* x,
                int64_t n, float* y, ThreadPool* pool, std::vector<float>* g,
                std::vector<float>* u, const FfnExtras& extras) {
  const size_t size = static_cast<size_t>(n * gate.rows());
  if (g->size() < size) g->resize(size);
  if (u->size() < size) u->resize(size);
  matmul(gate, x, n, g->data(), pool);
  matmul(up, x, n, u->data(), pool);
  if (extras.any()) {
    const int64_t ff = gate.rows(), h = down.rows();
    for (int64_t t = 0; t < n; ++t) {
      glu_with_extras(g->data() + t * ff, u->data() + t * ff, ff, 0, extras);
    }
    matmul(down, g->data(), n, y, pool);
    for (int64_t t = 0; t < n; ++t) add_down_bias(y + t * h, h, 0, extras);
    return;
  }
  swiglu(g->data(), u->data(), static_cast<int64_t>(size), g->data());
  matmul(down, g->data(), n, y, pool);
}

float yarn_mscale(float scale, float m) {
  if (scale <= 1.0f) return 1.0f;
  return 0.1f * m * std::log(scale) + 1.0f;
}

Rope::Rope(int64_t dim, float theta, const RopeScaling& scaling) : dim_(dim) {
  const int64_t half = dim / 2;
  inv_freq_.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq_[i] = static_cast<float>(
        1.0 / std::pow(static_cast<double>(theta), static_cast<double>(2 * i) / dim));
  }
  if (scaling.type == RopeScalingType::kLinear) {
    for (float& f : inv_freq_) f /= scaling.factor;
  } else if (scaling.type == RopeScalingType::kYarn) {
    // Dimension whose wavelength makes num_rot turns over the original context.
    auto correction_dim = [&](double num_rot) {
      return (dim * std::log(scaling.original_max_position_embeddings /
                             (num_rot * 2.0 * std::numbers::pi))) /
             (2.0 * std::log(static_cast<double>(theta)));
    };
    double low = std::floor(correction_dim(scaling.beta_fast));
    double high = std::ceil(correction_dim(scaling.beta_slow));
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double extra_mask = 1.0 - ramp;  // 1: keep the original (extrapolated) frequency
      const double extra = inv_freq_[i];
      const double inter = extra / scaling.factor;
      inv_freq_[i] = static_cast<float>(inter * (1.0 - extra_mask) + extra * extra_mask);
    }
    cos_sin_scale_ = yarn_mscale(scaling.factor, scaling.mscale) /
                     yarn_mscale(scaling.factor, scaling.mscale_all_dim);
    if (scaling.mscale_all_dim != 0.0f) {
      const float m = yarn_mscale(scaling.factor, scaling.mscale_all_dim);
      softmax_factor_ = m * m;
    }
  }
}

bool mrope_section_uses_position(const std::array<int64_t, 4>& sections, int64_t pair) {
  const int64_t total = sections[0] + sections[1] + sections[2] + sections[3];
  if (total <= 0) return true;
  const int64_t sector = pair % total;
  for (int64_t k = 0; k < 3; ++k) {
    if (sector % 3 == k && sector < 3 * sections[static_cast<size_t>(k)]) return true;
  }
  return false;
}

void Rope::set_sections(const std::array<int64_t, 4>& sections) {
  zero_pair_.clear();
  if (sections == std::array<int64_t, 4>{}) return;
  zero_pair_.resize(static_cast<size_t>(dim_ / 2));
  for (int64_t i = 0; i < dim_ / 2; ++i) {
    zero_pair_[static_cast<size_t>(i)] = mrope_section_uses_position(sections, i) ? 0 : 1;
  }
}

void Rope::angles(int64_t pos, float* c, float* s) const {
  for (int64_t i = 0; i < dim_ / 2; ++i) {
    const bool zero = !zero_pair_.empty() && zero_pair_[static_cast<size_t>(i)] != 0;
    const float angle = zero ? 0.0f : static_cast<float>(pos) * inv_freq_[i];
    c[i] = std::cos(angle) * cos_sin_scale_;
    s[i] = std::sin(angle) * cos_sin_scale_;
  }
}

void Rope::rotate(float* x, const float* c, const float* s, RopeForm form) const {
  const int64_t half = dim_ / 2;
  for (int64_t i = 0; i < half; ++i) {
    float* a = form == RopeForm::kNeox ? x + i : x + 2 * i;
    float* b = form == RopeForm::kNeox ? x + i + half : x + 2 * i + 1;
    const float x0 = *a;
    const float x1 = *b;
    *a = x0 * c[i] - x1 * s[i];
    *b = x0 * s[i] + x1 * c[i];
  }
}

void Rope::apply(float* x, int64_t pos, RopeForm form) const {
  thread_local std::vector<float> cs;
  cs.resize(static_cast<size_t>(dim_ / 2 * 2));
  angles(pos, cs.data(), cs.data() + dim_ / 2);
  rotate(x, cs.data(), cs.data() + dim_ / 2, form);
}

void q8_quantize(const float* x, int64_t d, int8_t* values) {
  float* scales = reinterpret_cast<float*>(values);
  for (int64_t b0 = 0; b0 < d; b0 += kQ8Block) {
    const int64_t n = std::min(kQ8Block, d - b0);
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < n; ++i) {
      amax = std::max(amax, std::fabs(x[b0 + i]));
      finite = finite && std::isfinite(x[b0 + i]);
    }
    // A NaN or infinity stays NaN when read back (as an F32 cache would pass it on), not int8
    // garbage: the block's scale NaN, its values 0.
    const float scale = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    const float inv = finite && scale != 0.0f ? 1.0f / scale : 0.0f;
    scales[-1 - b0 / kQ8Block] = scale;
    for (int64_t i = 0; i < n; ++i) {
      const float r = std::round(x[b0 + i] * inv);  // |r| <= 127 up to rounding: clamped
      values[b0 + i] = finite ? static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f)) : 0;
    }
  }
  for (int64_t i = d; i < (d + 3) / 4 * 4; ++i) values[i] = 0;
}

AttentionArgs widen_cache(const AttentionArgs& a, std::vector<float>* q, std::vector<float>* k,
                          std::vector<float>* v) {
  if (a.k8 == nullptr && a.k16 == nullptr && a.blocks == nullptr) return a;
  const int64_t n_ctx = a.pos0 + a.n_tokens;
  // Position s, KV head g of a cache (head g's rows `head` apart from head 0's) into F32 rows of
  // n_kv_heads * d per position.
  auto widen = [&](bool keys, int64_t head, int64_t d, std::vector<float>* dst, auto&& value) {
    const int64_t row = a.n_kv_heads * d;
    dst->resize(static_cast<size_t>(n_ctx * row));
    for (int64_t s = 0; s < n_ctx; ++s) {
      const int64_t at0 = keys ? k_offset(a, s) : v_offset(a, s);
      for (int64_t g = 0; g < a.n_kv_heads; ++g) {
        const int64_t at = at0 + g * head;
        for (int64_t i = 0; i < d; ++i) (*dst)[s * row + g * d + i] = value(at, i);
      }
    }
    return dst->data();
  };
  auto q8 = [](const int8_t* base) {
    return [base](int64_t at, int64_t i) { return q8_value(base + at, i); };
  };
  auto half = [f16 = a.f16](const uint16_t* base) {
    return [base, f16](int64_t at, int64_t i) {
      return f16 ? f16_to_f32(base[at + i]) : bf16_to_f32(base[at + i]);
    };
  };
  auto f32 = [](const float* base) {
    return [base](int64_t at, int64_t i) { return base[at + i]; };
  };
  AttentionArgs w = a;
  w.k8 = w.v8 = nullptr;
  w.k16 = w.v16 = nullptr;
  w.f16 = false;
  w.k_head = w.v_head = 0;
  w.blocks = nullptr;
  w.block_positions = w.k_block = w.v_block = 0;
  const bool same = a.k8 != nullptr   ? a.v8 == a.k8
                    : a.k16 != nullptr ? a.v16 == a.k16
                                       : a.v == a.k;
  auto widen_rows = [&](bool keys, std::vector<float>* dst) {
    const int64_t head = keys ? k_head_stride(a) : v_head_stride(a);
    const int64_t d = keys ? a.dk : a.dv;
    if (a.k8 != nullptr) return widen(keys, head, d, dst, q8(keys ? a.k8 : a.v8));
    if (a.k16 != nullptr) return widen(keys, head, d, dst, half(keys ? a.k16 : a.v16));
    return widen(keys, head, d, dst, f32(keys ? a.k : a.v));
  };
  w.k = widen_rows(true, k);
  w.k_stride = a.n_kv_heads * a.dk;
  if (same && a.v_stride == a.k_stride) {  // values the first dv of the key rows
    TD_CHECK(a.n_kv_heads == 1 && a.dv <= a.dk, "widen_cache: values in the keys' rows");
    w.v = w.k;
    w.v_stride = w.k_stride;
  } else {
    w.v = widen_rows(false, v);
    w.v_stride = a.n_kv_heads * a.dv;
  }
  if (a.k16 == nullptr || a.f16) return w;
  q->resize(static_cast<size_t>(a.n_tokens * a.q_stride));
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    for (int64_t i = 0; i < a.n_heads * a.dk; ++i) {
      (*q)[t * a.q_stride + i] = bf16_to_f32(f32_to_bf16(a.q[t * a.q_stride + i]));
    }
  }
  w.q = q->data();
  return w;
}

void attention_bf16_segments(const AttentionArgs& a, int64_t segment) {
  TD_CHECK(a.k16 != nullptr && a.v16 != nullptr && !a.f16 && segment > 0,
           "attention_bf16_segments: a BF16 cache");
  const int64_t group = a.n_heads / a.n_kv_heads;
  auto bf = [](float x) { return static_cast<double>(bf16_to_f32(f32_to_bf16(x))); };
  std::vector<double> x, o, o_seg;
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const int64_t n_ctx = a.pos0 + t + 1, lo = first_key(a, a.pos0 + t);
    for (int64_t h = 0; h < a.n_heads; ++h) {
      const int64_t g = h / group;
      const float* q = a.q + t * a.q_stride + h * a.dk;
      x.assign(static_cast<size_t>(n_ctx), 0.0);
      for (int64_t s = lo; s < n_ctx; ++s) {
        const uint16_t* k = a.k16 + k_offset(a, s) + g * k_head_stride(a);
        double d = 0;
        for (int64_t i = 0; i < a.dk; ++i) d += bf(q[i]) * bf16_to_f32(k[i]);
        x[s] = static_cast<double>(a.scale) * d;
      }
      // Segments (aligned to position 0) folded in order, as the kernel's SegmentFold; the sink
      // last, a segment of one key whose value is zero.
      double m = 0, l = 0;
      o.assign(static_cast<size_t>(a.dv), 0.0);
      const int64_t c_first = lo / segment * segment;
      for (int64_t c0 = c_first; c0 < n_ctx; c0 += segment) {
        const int64_t c1 = std::min(n_ctx, c0 + segment), b = std::max(c0, lo);
        const double m_s = *std::max_element(x.begin() + b, x.begin() + c1);
        double l_s = 0;
        o_seg.assign(static_cast<size_t>(a.dv), 0.0);
        for (int64_t s = b; s < c1; ++s) {
          const float p = static_cast<float>(std::exp(x[s] - m_s));
          l_s += p;
          const uint16_t* v = a.v16 + v_offset(a, s) + g * v_head_stride(a);
          for (int64_t j = 0; j < a.dv; ++j) o_seg[j] += bf(p) * bf16_to_f32(v[j]);
        }
        const double mn = c0 == c_first ? m_s : std::max(m, m_s);
        const double fa = c0 == c_first ? 0.0 : std::exp(m - mn), fb = std::exp(m_s - mn);
        for (int64_t j = 0; j < a.dv; ++j) o[j] = o[j] * fa + o_seg[j] * fb;
        l = l * fa + l_s * fb;
        m = mn;
      }
      if (a.sinks != nullptr) {
        const double sink = a.sinks[h], mn = std::max(m, sink);
        const double fa = std::exp(m - mn);
        for (int64_t j = 0; j < a.dv; ++j) o[j] *= fa;
        l = l * fa + std::exp(sink - mn);
      }
      float* out = a.out + (t * a.n_heads + h) * a.dv;
      for (int64_t j = 0; j < a.dv; ++j) out[j] = static_cast<float>(o[j] / l);
    }
  }
}

void attention(const AttentionArgs& any_cache, ThreadPool* pool) {
  std::vector<float> wq, wk, wv;
  const AttentionArgs a = widen_cache(any_cache, &wq, &wk, &wv);
  const int64_t group = a.n_heads / a.n_kv_heads;
  auto task = [&](size_t id) {
    thread_local std::vector<float> scores;
    const int64_t t = static_cast<int64_t>(id) / a.n_heads;
    const int64_t h = static_cast<int64_t>(id) % a.n_heads;
    const int64_t g = h / group;
    const int64_t n_ctx = a.pos0 + t + 1, lo = first_key(a, a.pos0 + t);
    scores.resize(static_cast<size_t>(n_ctx - lo));
    const float* q = a.q + t * a.q_stride + h * a.dk;
    for (int64_t s = lo; s < n_ctx; ++s) {
      scores[s - lo] = dot(q, a.k + s * a.k_stride + g * k_head_stride(a), a.dk) * a.scale;
    }
    softmax_with_sink(scores.data(), n_ctx - lo, sink_of(a, h));
    float* out = a.out + (t * a.n_heads + h) * a.dv;
    std::fill(out, out + a.dv, 0.0f);
    for (int64_t s = lo; s < n_ctx; ++s) {
      const float* v = a.v + s * a.v_stride + g * v_head_stride(a);
      const float p = scores[s - lo];
      for (int64_t j = 0; j < a.dv; ++j) out[j] += p * v[j];
    }
  };
  const size_t n = static_cast<size_t>(a.n_tokens * a.n_heads);
  if (pool == nullptr || n == 1) {
    for (size_t i = 0; i < n; ++i) task(i);
  } else {
    pool->run(n, task);
  }
}

}  // namespace tandem::ops
