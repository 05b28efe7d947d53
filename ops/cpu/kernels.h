// The fast CPU matrix kernels: y = x * W^T for weights in the formats experts and dense layers
// are stored or repacked in, with activations converted once per matrix family (gate and up share
// them) into the encoding the format's dot product wants: ggml's Q8_K / Q8_0 blocks for the GGUF
// K-quants and the legacy 32-blocks Q8_0, Q5_0, Q4_0, Q4_1, Q5_1 (integer dot products, as
// llama.cpp computes them); F32 for F32, F16 and BF16 weights (unquantized weights keep exact F32
// activations, which the golden logits need).
//
// Every format has a scalar reference (gemm_reference) of exactly the same arithmetic; the SIMD
// variants (AVX2, AVX-512, AVX-512 VNNI/BF16) come from one algorithm template per format and are
// checked against it on every ISA the machine has (tests/unit/ops_kernels_test.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/cpu_features.h"
#include "core/memory.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::kern {

enum class WFormat : uint8_t {
  kF32, kF16, kBF16, kFP8Block, kInt8, kInt4, kQ4_K, kQ5_K, kQ6_K, kQ8_0, kQ5_0,
  kBF16Tile,  // BF16 in 16-row tiles of k pairs (packed.h): `--cpu-experts bf16`, BF16 activations
  kQ4_0, kQ4_1, kQ5_1,  // ggml's legacy 32-blocks (Q5_1: llama-quantize's Q5_K fallback)
  kQ2_K, kQ3_K,         // the low-bit K-quants of Q2_K / Q3_K_* files
  kQ4_KX16,  // Q4_K rows interleaved 16 at a time (q4k_x16.h): `--cpu-experts repack`
  kQ5_0X4, kQ8_0X4,  // Q5_0 / Q8_0 rows, blocks rearranged 4 at a time (q0_x4.h): `repack`
  kQ6_KX16,          // Q6_K rows interleaved 16 at a time (q6k_x16.h): `--cpu-experts repack`
  kMXFP4             // OCP MXFP4 32-blocks (gpt-oss's experts, llama-quantize's MXFP4_MOE)
};
const char* wformat_name(WFormat f);

// Activation encodings: kQ8_K = ggml block_q8_K rows (Q2_K .. Q6_K, Q4_K / Q6_K x16), kQ8_0 = ggml
// block_q8_0 rows with the Q8_1 sums (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: the last two llama.cpp's
// fallbacks for expert rows not a multiple of 256), kF32 (F32, F16, BF16), kBF16 (block-scaled FP8, packed
// BF16 tiles), kI8 (packed INT8/INT4).
enum class AFormat : uint8_t { kF32, kBF16, kQ8_K, kQ8_0, kI8 };
AFormat act_format(WFormat f);
// Values per activation block of f (256 for Q8_K, 32 for Q8_0, else 1): a matrix's cols must be a
// multiple of its activations' block.
int64_t block_of(AFormat f);

// A weight matrix [rows N, cols K] as a kernel reads it: a zero-copy view on stored data (GGUF
// blocks, BF16/F16/F32 rows, FP8 + block scales) or a packed layout (owned memory or a mapped
// cache file kept alive by `owner`).
struct KMatrix {
  WFormat format = WFormat::kF32;
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;
  int64_t row_bytes = 0;  // stored formats: bytes per row
  // FP8Block: value = fp8[r][c] * scales[((row0 + r) / block_rows) * scale_stride + c / block_cols]
  const float* scales = nullptr;
  int64_t scale_stride = 0, block_rows = 0, block_cols = 0, row0 = 0;
  int group = 0;                      // INT8/INT4 quantization group
  std::shared_ptr<const void> owner;  // keeps packed / mapped memory alive; null for views
  uint64_t bytes() const;             // bytes one full pass over the matrix reads (incl. scales)
  bool valid() const { return data != nullptr; }
};

// Zero-copy view on a stored weight; false when its dtype has no fast kernel (use ops::matmul).
bool view_weight(const ops::Weight& w, KMatrix* out);
// Row tile granularity: gemm's n0 (and n1 unless n1 == rows) must be multiples of it.
int64_t row_align(const KMatrix& w);
// Column granularity: a column slice starts (and ends, unless at cols) on a multiple of it (a GGUF
// block, a packed group, an FP8 scale block; 1 for F32/F16/BF16).
int64_t col_align(const KMatrix& w);
// A copy of rows [r0, r1) x columns [c0, c1) of w in the same format, in memory allocated with
// `alloc` (NUMA tensor parallelism binds it to the node that reads it). Bounds on row_align /
// col_align (or the matrix ends), else Error(kInvalidArgument). FP8 block scales stay shared with
// w (they are 1/16384 of the bytes); the copy keeps w's owner alive for them.
KMatrix copy_submatrix(const KMatrix& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                       const AllocOptions& alloc);

// 64-byte aligned bytes, so SIMD loads of activation rows never split cache lines needlessly.
template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}  // NOLINT
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const {
    return true;
  }
};

// Converted activations of `tokens` rows of `cols` values, reused without reallocating.
struct Activations {
  AFormat format = AFormat::kF32;
  int64_t tokens = 0, cols = 0;
  int group = 0;
  int64_t row_bytes = 0;  // bytes per token row in data
  std::vector<uint8_t, AlignedAllocator<uint8_t>> data;
  const uint8_t* row(int64_t t) const { return data.data() + t * row_bytes; }
};
// x is [tokens, ldx]; the first cols values of each row are converted. cols must be a multiple of
// the format's block (256 for Q8_K, 32 for Q8_0).
// pool: converts blocks of tokens in parallel (GGUF / F32 activations; nullptr: this thread).
// isa: the highest level to use; every level gives the same bytes (Q8_K / Q8_0 have AVX-512 code).
void quantize_activations(AFormat format, int group, const float* x, int64_t tokens, int64_t cols,
                          int64_t ldx, Activations* out, ThreadPool* pool = nullptr,
                          Isa isa = best_isa());

// y[t * ldy + n] = sum_k act[t][k] * w[n][k] for t < a.tokens and n in [n0, n1): y is the FULL
// output (absolute column n); each call writes only its columns. Few tokens take the GEMV path
// (each weight block loaded once for all of them), many the row-tiled GEMM. isa: the highest
// level to use (kernels fall back to the best lower level they have).
void gemm(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1, float* y, int64_t ldy,
          Isa isa = best_isa());
// The scalar reference of exactly the same arithmetic (same activation quantization).
void gemm_reference(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1, float* y,
                    int64_t ldy);

// Dense convenience (attention projections, dense FFN, shared experts, lm_head, router):
// converts x once and splits rows into tasks on pool (nullptr: the calling thread; a GEMV of <= 4
// tokens: each thread one contiguous share of the rows, core/range_shares.h); falls back to
// ops::matmul when the weight's dtype has no kernel. x [tokens, K], y [tokens, N].
// views: prepared copies of some weights (`--cpu-experts repack`: the non-expert matrices
// rearranged into one huge-page arena, CpuExperts::other), used instead of w's stored bytes when
// they hold w (the same products).
using WeightViews = std::unordered_map<const ops::Weight*, KMatrix>;
void matmul(const ops::Weight& w, const float* x, int64_t tokens, float* y, ThreadPool* pool,
            const WeightViews* views = nullptr);
// The same with a prepared matrix and reusable activation storage.
void matmul(const KMatrix& w, const float* x, int64_t tokens, float* y, ThreadPool* pool,
            Activations* scratch);
// Several matrices of the same input (q and kv_a, gate and up): x converted once and every
// matrix's row tasks in one pool dispatch, so a small matrix costs no dispatch, conversion or
// tail of its own. ys[i] is [tokens, ws[i].rows]; each result equals matmul's. The KMatrix form
// requires the same cols and activation encoding (Error otherwise); the Weight form falls back to
// one matmul per weight when they differ or one has no kernel. At most kMaxSharedInput matrices.
inline constexpr size_t kMaxSharedInput = 4;
void matmul_shared_input(std::span<const KMatrix* const> ws, const float* x, int64_t tokens,
                         std::span<float* const> ys, ThreadPool* pool, Activations* scratch);
void matmul_shared_input(std::span<const ops::Weight* const> ws, const float* x, int64_t tokens,
                         std::span<float* const> ys, ThreadPool* pool,
                         const WeightViews* views = nullptr);

// out[i] = ops::silu(gate[i]) * up[i] for i < n, bit for bit, in AVX-512 or AVX2 (out may alias
// gate or up). isa: the highest level to use.
void swiglu(const float* gate, const float* up, int64_t n, float* out, Isa isa = best_isa());

// ops::swiglu_ffn on the kernels: gate and up in one matmul_shared_input (one conversion of x),
// kern::swiglu, down; views as matmul's. (Dense FFNs, shared experts.)
void swiglu_ffn(const ops::Weight& gate, const ops::Weight& up, const ops::Weight& down,
                const float* x, int64_t n, float* y, ThreadPool* pool, const WeightViews* views,
                std::vector<float>* g, std::vector<float>* u);

// c[i][j] = sum_p a[i][p] * b[p][j] for i < m, j < n: F32, b in its stored [k, n] orientation
// (a weight whose rows run along the reduction: GGUF's transposed k_b for expanded MLA), a
// [m, lda], c [m, ldc]. Each output one fused multiply-add chain over p in order from 0, the
// scalar reference's (isa kScalar) bits on every level. AVX-512 register blocks of 6 rows x 64
// columns (n a multiple of 64 there; other n run the reference). Single-threaded.
void gemm_f32_kn(const float* a, int64_t lda, int64_t m, const float* b, int64_t k, int64_t n,
                 float* c, int64_t ldc, Isa isa = best_isa());

// ops::index_scores's contract (DeepSeek Sparse Attention's indexer: one query's scores against
// the first n cached keys), the keys in tiles of 64 positions on `pool`, each tile's dot products
// with every head one gemm_f32_kn; the reference's bits.
void index_scores(const ops::AttentionArgs& keys, const float* q, const float* w, int64_t heads,
                  int64_t n, float* out, ThreadPool* pool);

// ops::attention's contract, one task per (token, KV head) on `pool`: the scores of every query
// head sharing that KV head against all its cached keys, softmax, then the weighted sum of the
// values. AVX-512: register-blocked scores and value sums over segments of 256 keys, each
// segment's softmax folded into the output in order (attention_avx512.cpp: the cache read once);
// below it the scores as one small GEMM of the F32 kernel and a scalar value loop. A token's
// output does not depend on the other tokens of the call. isa: the highest level to use.
void attention(const ops::AttentionArgs& args, ThreadPool* pool, Isa isa = best_isa());

// On AVX-512 with a pool, a one-token call with one KV group of >= 8 heads (absorbed MLA decode)
// and at least kLongDecodeContext cached positions spreads its key segments over the threads
// (each thread every head over its share of the cache), then folds each head's segments (the
// heads split over the threads) instead of a task per block of heads (each reading all of the
// cache); same bits. attention_splits_cache says whether a call takes that path (never with a
// window or sinks: gpt-oss's GQA has no such group).
inline constexpr int64_t kLongDecodeContext = 512;
bool attention_splits_cache(const ops::AttentionArgs& args, const ThreadPool* pool,
                            Isa isa = best_isa());

}  // namespace tandem::kern
