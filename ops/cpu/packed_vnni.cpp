// AVX-512 VNNI + BF16 instantiation of the packed kernels. INT8: vpdpbusd wants one unsigned
// operand, so the activations are read biased by 128 (the copy q_a ^ 0x80 in the activation row)
// and 128 * sum(w) of each row and group (stored with the weights) is subtracted once per group.
// INT4: the nibbles are the unsigned operand and the activations stay signed. FP8: E4M3 is expanded
// to BF16 in registers (pure integer ops, exact) and multiplied with vdpbf16ps, post-scaled once
// per scale block (the GEMV on CPUs with VBMI: packed_fp8_vbmi.cpp). BF16 tiles: one vdpbf16ps
// per 16-row chunk and token.
// GCC 12 warns falsely inside its own AVX-512 intrinsic headers (undefined-vector idiom).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/cpu_features.h"
#include "ops/cpu/packed_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16")

#include "ops/cpu/fp8_expand_avx512.h"
#include "ops/cpu/packed_impl.h"

namespace tandem::kern::detail {
namespace {

struct Vnni {
  using VI = __m512i;
  using VF = __m512;
  static constexpr int kLanes = 16, kVecs = 1, kMaxTokens = 4, kTiles = 4;
  static constexpr bool kBiasedS8 = true;
  static VI zero_i() { return _mm512_setzero_si512(); }
  static VF zero_f() { return _mm512_setzero_ps(); }
  static VI load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static VI bcast(int32_t bits) { return _mm512_set1_epi32(bits); }
  // vpdpbusd in place (asm: GCC 12 copies the accumulator around the intrinsic, one extra move per
  // dot product in the unrolled tile loops). acc += u8 x s8, per lane sums of 4.
  static VI dpbusd(VI acc, VI u8, VI s8) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
    return acc;
  }
  static VI dot_s8(VI acc, VI w, VI a_biased) { return dpbusd(acc, a_biased, w); }
  static void fp8_expand(const uint8_t* const* src, int64_t pairs, uint16_t* dst) {
    fp8_expand_avx512(src, pairs, dst);
  }
  // FP8 rows (few tokens): 32 E4M3 expanded to BF16, vdpbf16ps with the BF16 activations.
  static constexpr int kFp8Step = 32;
  using F8 = VI;
  using FA = uint16_t;
  using FP = VF;
  static constexpr float kFp8Scale = 1.0f;
  static FP fp8_zero() { return _mm512_setzero_ps(); }
  static VF fp8_part(FP p) { return p; }
  static F8 fp8_load(const uint8_t* w) { return fp8x32_to_bf16(w); }
  static VF fp8_dot(VF part, F8 w, const uint16_t* a) {
    return _mm512_dpbf16_ps(part, (__m512bh)w, (__m512bh)_mm512_loadu_si512(a));
  }
  static float hsum_f(VF v) { return _mm512_reduce_add_ps(v); }
  // BF16 tiles: the chunk and the broadcast pair are vdpbf16ps operands as they are.
  using WB = VI;
  using AB = VI;
  static WB bf16_w(VI chunk) { return chunk; }
  // The k pair c of an activation row (its BF16 values; vdpbf16ps takes them as they are).
  static AB bf16_a_at(const uint8_t* row, int64_t c, int64_t) {
    int32_t pair;
    std::memcpy(&pair, row + 4 * c, 4);
    return _mm512_set1_epi32(pair);
  }
  static VF bf16_dot(VF acc, WB w, AB a) {
    asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(w), "v"(a));  // in place, as dpbusd
    return acc;
  }
  static VI dot_u4(VI acc, VI u, VI a) { return dpbusd(acc, u, a); }
  static VI low_nibbles(VI b) { return _mm512_and_si512(b, _mm512_set1_epi8(0x0F)); }
  static VI high_nibbles(VI b) {
    return _mm512_and_si512(_mm512_srli_epi16(b, 4), _mm512_set1_epi8(0x0F));
  }
  static VI add_i(VI a, VI b) { return _mm512_add_epi32(a, b); }
  static VI sub(VI a, VI b) { return _mm512_sub_epi32(a, b); }
  static VI shl7(VI a) { return _mm512_slli_epi32(a, 7); }
  static VF set1_f(float f) { return _mm512_set1_ps(f); }
  static VF load_f(const float* p) { return _mm512_loadu_ps(p); }
  static VF mul_f(VF a, VF b) { return _mm512_mul_ps(a, b); }
  static VF fmadd_f(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
  static VF cvt_f(VI a) { return _mm512_cvtepi32_ps(a); }
  static void store_f(float* p, VF v) { _mm512_storeu_ps(p, v); }
};

void fp8_kernel_base(const PackedArgs& p) {
  if (p.a->tokens >= kFp8TileMinTokens) {
    packed_impl::fp8_gemm<Vnni>(p);
  } else {
    packed_impl::fp8_row_kernel<Vnni>(p);
  }
}

void fp8_kernel(const PackedArgs& p) {
  if (fp8_rows_vbmi_fits(*p.w, p.a->tokens)) {
    fp8_rows_vbmi(p);
  } else {
    fp8_kernel_base(p);
  }
}

}  // namespace

void fp8_expand_vnni(const uint8_t* const* src, int64_t pairs, uint16_t* dst) {
  Vnni::fp8_expand(src, pairs, dst);
}

const PackedKernels& packed_kernels_vnni_base() {
  static const PackedKernels k{&packed_impl::int_kernel<Vnni, false>,
                               &packed_impl::int_kernel<Vnni, true>, &fp8_kernel_base,
                               &packed_impl::bf16_kernel<Vnni>};
  return k;
}

// The integer kernels use no BF16 instruction: CPUs with VNNI but without BF16 (Cascade Lake, Ice
// Lake) run them (objdump: vdpbf16ps / vcvtne*2bf16 appear only in the fp8 and bf16 functions).
// Their FP8 GEMV is packed_fp8_vbmi_f32.cpp's where the CPU has VBMI and GFNI (Ice Lake), the
// AVX-512 table's else.
namespace {

void fp8_kernel_no_bf16(const PackedArgs& p) {
  static const bool vbmi = cpu_features().avx512_vbmi && cpu_features().gfni;
  if (vbmi && fp8_rows_vbmi_fits(*p.w, p.a->tokens)) {
    fp8_rows_vbmi_f32(p);
  } else {
    packed_kernels_avx512().fp8(p);
  }
}

}  // namespace

const PackedKernels& packed_kernels_vnni_int() {
  static const PackedKernels k{&packed_impl::int_kernel<Vnni, false>,
                               &packed_impl::int_kernel<Vnni, true>, &fp8_kernel_no_bf16,
                               nullptr};
  return k;
}

const PackedKernels& packed_kernels_vnni() {
  static const PackedKernels k{&packed_impl::int_kernel<Vnni, false>,
                               &packed_impl::int_kernel<Vnni, true>, &fp8_kernel,
                               &packed_impl::bf16_kernel<Vnni>};
  static const bool vbmi = cpu_features().avx512_vbmi;
  return vbmi ? k : packed_kernels_vnni_base();
}

}  // namespace tandem::kern::detail

#pragma GCC pop_options
