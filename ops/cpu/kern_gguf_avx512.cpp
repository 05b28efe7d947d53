// AVX-512 F/BW/VL/DQ instances of the GGUF / dense kernel templates (compiled with the matching -mavx512* flags
// and -ffp-contract=off; see ops/cpu/CMakeLists.txt). Selected only when the CPU has them.
#include "ops/cpu/kern_gguf_impl.h"
#include "ops/cpu/kern_gguf_avx512.h"
#include "ops/cpu/kern_q4k_gemv16.h"

namespace {

using S = Avx512<false>;
void q50(const GemmArgs& g) { drive<Q50Kern<S>>(g); }
void q40(const GemmArgs& g) { drive<Q40Kern<S>>(g); }
void mxfp4(const GemmArgs& g) { drive<Mxfp4Kern<S>>(g); }
void q41(const GemmArgs& g) { drive<Q41Kern<S>>(g); }
void q51(const GemmArgs& g) { drive<Q51Kern<S>>(g); }
void q80(const GemmArgs& g) { drive<Q80Kern<S>>(g); }
// The K-quants: one token 16 rows at a time, more through the row kernels (kern_q4k_gemv16.h).
void q4k(const GemmArgs& g) { k_rows<S, BlockQ4_K>(g); }
void q5k(const GemmArgs& g) { k_rows<S, BlockQ5_K>(g); }
void q6k(const GemmArgs& g) { k_rows<S, BlockQ6_K>(g); }
void q2k(const GemmArgs& g) { k_rows<S, BlockQ2_K>(g); }
void q3k(const GemmArgs& g) { k_rows<S, BlockQ3_K>(g); }
void f32(const GemmArgs& g) { drive<DenseKern<S, Dense::kF32>>(g); }
void f16(const GemmArgs& g) { drive<DenseKern<S, Dense::kF16>>(g); }
void bf16(const GemmArgs& g) { drive<DenseKern<S, Dense::kBF16>>(g); }

}  // namespace

namespace tandem::kern::detail {

const GgufKernels& gguf_kernels_avx512() {
  static const GgufKernels k = [] {
    GgufKernels t{q4k, q5k, q6k, q80, f32, f16, bf16, q50, q40, q41, q51, q2k, q3k};
    t.mxfp4 = mxfp4;
    return t;
  }();
  return k;
}

}  // namespace tandem::kern::detail
