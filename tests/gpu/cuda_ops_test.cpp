// The dense-part kernels of ops/cuda/attention.h against the CPU reference on odd sizes: RMSNorm
// over strided rows (in place too), RoPE (NeoX and interleaved, YaRN-scaled angles from
// ops::Rope) over strided heads, cache row writes (Q8_0 rows too), and attention over F32,
// BF16, F16 and Q8_0 caches (the decode kernel that splits long sequences across blocks too):
// contiguous and
// paged (shuffled blocks, a chunk crossing a block), GQA, a sliding window, gpt-oss's sinks,
// against ops::attention within F32 rounding. Label gpu: skipped (exit 77) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_gate.h"

#ifdef TANDEM_HAVE_CUDA
#include "core/dtype.h"
#include "core/fp_convert.h"
#include "ops/cpu/ref_ops.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cuda_util.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

template <typename T>
DeviceBuffer up(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

// rows x d values as Q8_0 cache rows (ops::q8_quantize), q8_row_bytes(d) bytes each.
std::vector<int8_t> quantize_q8(const std::vector<float>& x, int64_t rows, int64_t d) {
  const int64_t rb = ops::q8_row_bytes(d);
  std::vector<int8_t> out(static_cast<size_t>(rows * rb));
  for (int64_t r = 0; r < rows; ++r) {
    ops::q8_quantize(x.data() + r * d, d, out.data() + r * rb + ops::q8_lead_bytes(d));
  }
  return out;
}

// The 16-bit caches' elements as the CPU cache stores them (core/fp_convert.h).
std::vector<uint16_t> narrow(const std::vector<float>& v, DType type) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = type == DType::kF16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
  }
  return out;
}

std::vector<float> down(const DeviceBuffer& b, size_t n) {
  std::vector<float> v(n);
  b.download(v.data(), n * 4);
  return v;
}

TEST(CudaOps, RmsNormStridedAndInPlace) {
  std::mt19937 rng(1);
  const int64_t rows = 5, n = 67, stride = 80;
  const auto x = randn(rows * stride, rng), w = randn(n, rng);
  std::vector<float> want(rows * stride, 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    ops::rms_norm(&x[r * stride], w.data(), n, 1e-6f, &want[r * stride]);
  DeviceBuffer dx = up(x), dw = up(w), dout = up(std::vector<float>(rows * stride, 0.0f));
  TD_CUDA_CHECK(rms_norm_cuda(dx.as<float>(), stride, dw.as<float>(), rows, n, 1e-6f,
                              dout.as<float>(), stride, nullptr));
  TD_CUDA_CHECK(rms_norm_cuda(dx.as<float>(), stride, dw.as<float>(), rows, n, 1e-6f,
                              dx.as<float>(), stride, nullptr));
  TD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = down(dout, want.size()), in_place = down(dx, want.size());
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> g(got.begin() + r * stride, got.begin() + r * stride + n);
    const std::vector<float> p(in_place.begin() + r * stride, in_place.begin() + r * stride + n);
    const std::vector<float> e(want.begin() + r * stride, want.begin() + r * stride + n);
    EXPECT_LE(test::max_rel_diff(g, e), 1e-6) << r;
    EXPECT_LE(test::max_rel_diff(p, e), 1e-6) << r;
  }
  EXPECT_EQ(rms_norm_cuda(dx.as<float>(), 10, dw.as<float>(), rows, n, 1e-6f, dx.as<float>(), 10,
                          nullptr),
            cudaErrorInvalidValue);
}

TEST(CudaOps, RopeBothFormsWithYarn) {
  std::mt19937 rng(2);
  RopeScaling ys;
  ys.type = RopeScalingType::kYarn;
  ys.factor = 4.0f;
  ys.original_max_position_embeddings = 64;
  ys.mscale_all_dim = 0.707f;
  const ops::Rope rope(32, 10000.0f, ys);
  const int64_t T = 3, heads = 3, hs = 48, ts = heads * hs + 5, off = 16, half = 16;
  const std::vector<int64_t> pos = {0, 77, 1000};
  std::vector<float> c(T * half), s(T * half);
  for (int64_t t = 0; t < T; ++t) rope.angles(pos[t], &c[t * half], &s[t * half]);
  for (const bool neox : {true, false}) {
    auto x = randn(T * ts, rng);
    std::vector<float> want = x;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        rope.rotate(&want[t * ts + h * hs + off], &c[t * half], &s[t * half],
                    neox ? ops::RopeForm::kNeox : ops::RopeForm::kInterleaved);
      }
    }
    DeviceBuffer dx = up(x), dc = up(c), dsn = up(s);
    TD_CUDA_CHECK(rope_cuda(dx.as<float>(), T, ts, heads, hs, off, 32, dc.as<float>(),
                            dsn.as<float>(), neox, nullptr));
    TD_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LE(test::max_rel_diff(down(dx, x.size()), want), 1e-6) << neox;
  }
}

TEST(CudaOps, KvWriteRows) {
  std::mt19937 rng(3);
  const int64_t d = 37, rows = 4;
  const auto src = randn(rows * 40, rng);
  const std::vector<int64_t> offsets = {500, 0, 37 * 3, 200};
  std::vector<float> want(600, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(&src[r * 40], &src[r * 40] + d, want.begin() + offsets[r]);
  }
  DeviceBuffer dsrc = up(src), doff = up(offsets);
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    const size_t elem = type == DType::kF32 ? 4 : 2;
    DeviceBuffer dst(600 * elem);
    TD_CUDA_CHECK(cudaMemset(dst.data(), 0, dst.bytes()));
    TD_CUDA_CHECK(kv_write_cuda(type, dst.data(), doff.as<int64_t>(), rows, dsrc.as<float>(), 40, d,
                                nullptr));
    TD_CUDA_CHECK(cudaDeviceSynchronize());
    if (type == DType::kF32) {
      EXPECT_EQ(down(dst, 600), want);
    } else {
      std::vector<uint16_t> got(600);
      dst.download(got.data(), 600 * 2);
      EXPECT_EQ(got, narrow(want, type));  // the CPU cache's rounding, bit for bit
    }
  }
  // Q8_0 rows (offsets in bytes, at each row's values): ops::q8_quantize's bytes, scales and
  // padding included; the bytes around them untouched. A NaN makes its block's scale NaN.
  std::vector<float> q8src = src;
  q8src[40 * 2 + 33] = std::numeric_limits<float>::quiet_NaN();
  const int64_t rb = ops::q8_row_bytes(d), lead = ops::q8_lead_bytes(d);
  const std::vector<int64_t> q8off = {lead + 3 * rb, lead, lead + 5 * rb, lead + rb};
  std::vector<int8_t> want8(static_cast<size_t>(7 * rb), 0x55);
  for (int64_t r = 0; r < rows; ++r) ops::q8_quantize(&q8src[r * 40], d, want8.data() + q8off[r]);
  DeviceBuffer dsrc8 = up(q8src), doff8 = up(q8off),
               dst8 = up(std::vector<int8_t>(want8.size(), 0x55));
  TD_CUDA_CHECK(kv_write_cuda(DType::kQ8_0, dst8.data(), doff8.as<int64_t>(), rows,
                              dsrc8.as<float>(), 40, d, nullptr));
  TD_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int8_t> got8(want8.size());
  dst8.download(got8.data(), got8.size());
  EXPECT_EQ(got8, want8);
  EXPECT_EQ(kv_write_cuda(DType::kQ4_0, dsrc.data(), doff.as<int64_t>(), rows, dsrc.as<float>(), 40,
                          d, nullptr),
            cudaErrorInvalidValue);
}

struct AttnCase {
  bool paged;
  int64_t heads, kv_heads, dk, dv, n_tokens, pos0, window;
  bool sinks;
  bool values_in_keys = false;  // MLA's cache: the values are each key row's first dv floats
};

class CudaAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttention, EqualsTheReference) {
  const AttnCase c = GetParam();
  std::mt19937 rng(4);
  const int64_t P = c.pos0 + c.n_tokens, B = 64, nb = (P + B - 1) / B;
  const int64_t ks = c.kv_heads * c.dk, vs = c.kv_heads * c.dv;
  // The cache: contiguous [P, kv_heads, d], or paged: nb + 2 blocks of B positions, the
  // sequence's blocks shuffled among them.
  std::vector<int32_t> blocks(static_cast<size_t>(nb));
  std::iota(blocks.begin(), blocks.end(), 1);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  const int64_t slots = c.paged ? (nb + 2) * B : P;
  const auto k = randn(slots * ks, rng), v = randn(slots * vs, rng);
  const auto q = randn(c.n_tokens * c.heads * c.dk, rng);
  const auto sinks = randn(c.heads, rng);
  ops::AttentionArgs a;
  if (c.values_in_keys) {  // as KvCache::attention_args describes a latent cache
    a.v_stride = ks;
    if (c.paged) a.v_block = B * ks;
  }
  a.q_stride = c.heads * c.dk;
  a.n_tokens = c.n_tokens;
  a.n_heads = c.heads;
  a.n_kv_heads = c.kv_heads;
  a.dk = c.dk;
  a.dv = c.dv;
  a.k_stride = ks;
  if (!c.values_in_keys) a.v_stride = vs;
  if (c.paged) {
    a.block_positions = B;
    a.k_block = B * ks;
    if (!c.values_in_keys) a.v_block = B * vs;
  }
  a.pos0 = c.pos0;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  a.window = c.window;
  DeviceBuffer dq = up(q), dsink = up(sinks), dblocks = up(blocks);
  // F32, BF16 and F16 caches: the reference reads the same cache elements (ops::attention).
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0}) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    const bool q8 = type == DType::kQ8_0;
    const std::vector<uint16_t> k16 = narrow(k, q8 ? DType::kF16 : type),
                                v16 = narrow(v, q8 ? DType::kF16 : type);
    // Q8_0: each (slot, KV head) row q8_row_bytes(d) bytes, its scales then its values.
    const std::vector<int8_t> k8 = quantize_q8(k, slots * c.kv_heads, c.dk),
                              v8 = quantize_q8(v, slots * c.kv_heads, c.dv);
    const int64_t k8row = ops::q8_row_bytes(c.dk), v8row = ops::q8_row_bytes(c.dv);
    std::vector<float> want(c.n_tokens * c.heads * c.dv);
    ops::AttentionArgs h = a;
    h.q = q.data();
    if (q8) {  // (strides in bytes; the values of position 0's first head)
      h.k8 = k8.data() + ops::q8_lead_bytes(c.dk);
      h.v8 = c.values_in_keys ? h.k8 : v8.data() + ops::q8_lead_bytes(c.dv);
      h.k_stride = c.kv_heads * k8row;
      h.v_stride = c.values_in_keys ? h.k_stride : c.kv_heads * v8row;
      h.k_head = k8row;
      h.v_head = c.values_in_keys ? k8row : v8row;
      if (c.paged) {
        h.k_block = B * h.k_stride;
        h.v_block = B * h.v_stride;
      }
    } else if (type == DType::kF32) {
      h.k = k.data();
      h.v = c.values_in_keys ? k.data() : v.data();
    } else {
      h.k16 = k16.data();
      h.v16 = c.values_in_keys ? k16.data() : v16.data();
      h.f16 = type == DType::kF16;
    }
    h.blocks = c.paged ? blocks.data() : nullptr;
    h.sinks = c.sinks ? sinks.data() : nullptr;
    h.out = want.data();
    ops::attention(h, nullptr);

    DeviceBuffer dk = q8 ? up(k8) : type == DType::kF32 ? up(k) : up(k16);
    DeviceBuffer dv = q8 ? up(v8) : type == DType::kF32 ? up(v) : up(v16);
    DeviceBuffer dout = up(std::vector<float>(want.size(), 0.0f));
    ops::AttentionArgs d = h;
    d.q = dq.as<float>();
    if (q8) {
      d.k8 = dk.as<int8_t>() + ops::q8_lead_bytes(c.dk);
      d.v8 = c.values_in_keys ? d.k8 : dv.as<int8_t>() + ops::q8_lead_bytes(c.dv);
    } else if (type == DType::kF32) {
      d.k = dk.as<float>();
      d.v = c.values_in_keys ? d.k : dv.as<float>();
    } else {
      d.k16 = dk.as<uint16_t>();
      d.v16 = c.values_in_keys ? d.k16 : dv.as<uint16_t>();
    }
    d.blocks = c.paged ? dblocks.as<int32_t>() : nullptr;
    d.sinks = c.sinks ? dsink.as<float>() : nullptr;
    d.out = dout.as<float>();
    const int64_t nf = attention_scratch_floats(d);
    DeviceBuffer scratch(static_cast<size_t>(nf) * 4);
    TD_CUDA_CHECK(attention_cuda(d, scratch.as<float>(), nf, nullptr));
    TD_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = down(dout, want.size());
    EXPECT_LE(test::max_rel_diff(got, want), 1e-5);
    EXPECT_EQ(attention_cuda(d, scratch.as<float>(), nf - 1, nullptr), cudaErrorInvalidValue);
    // The split kernels with the first position read from device memory (a graph's replay): the
    // same output with a.pos0 saying something else, and the same scratch.
    if (attention_cuda_splits(d)) {
      DeviceBuffer dpos0 = up(std::vector<int64_t>{c.pos0});
      ops::AttentionArgs r = d;
      r.pos0 = 0;
      EXPECT_EQ(attention_scratch_floats(r), nf);
      dout.fill_zero();
      TD_CUDA_CHECK(attention_cuda(r, scratch.as<float>(), nf, nullptr, dpos0.as<int64_t>()));
      TD_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(down(dout, want.size()), got);
    } else {
      DeviceBuffer dpos0 = up(std::vector<int64_t>{c.pos0});
      EXPECT_EQ(attention_cuda(d, scratch.as<float>(), nf, nullptr, dpos0.as<int64_t>()),
                cudaErrorInvalidValue);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Caches, CudaAttention,
    ::testing::Values(AttnCase{false, 4, 4, 64, 64, 1, 0, 0, false},     // first token
                      AttnCase{false, 6, 2, 72, 40, 3, 70, 0, false},    // GQA, odd dims
                      AttnCase{true, 6, 2, 72, 40, 5, 61, 0, false},     // paged, crossing a block
                      AttnCase{true, 8, 1, 576, 512, 2, 130, 0, false},  // MLA's latent shape
                      AttnCase{true, 4, 2, 64, 64, 4, 150, 32, true},    // window + sinks
                      AttnCase{false, 3, 3, 45, 45, 17, 0, 0, true},     // a prefill chunk
                      // Decode over long sequences: the keys split across blocks, 8 heads of a KV
                      // head per block (the split kernel), merged with the sinks.
                      AttnCase{true, 20, 1, 576, 512, 1, 3000, 0, false, true},  // MLA, 3 groups
                      AttnCase{true, 16, 1, 576, 512, 3, 1500, 0, false, true},  // MLA, 3 tokens
                      AttnCase{true, 32, 4, 128, 128, 2, 2500, 0, true},         // GQA + sinks
                      AttnCase{false, 12, 3, 72, 40, 4, 1000, 300, false},       // window
                      AttnCase{true, 6, 2, 72, 40, 8, 700, 0, true}));  // 8 tokens, odd dims

}  // namespace
}  // namespace tandem
#endif

int main(int argc, char** argv) {
  return tandem::test::gpu_test_main(argc, argv);
}
