// SwiGLU in SIMD over a traits struct S (Avx2 in quant_act_avx2.cpp, Avx512 in
// quant_act_avx512.cpp, each compiled for its ISA with -ffp-contract=off): out[i] =
// ops::silu(gate[i]) * up[i] bit for bit. ops::exp_for_silu's steps lane by lane, each the same
// IEEE operation (its std::fma steps by S::fma / S::fnmadd; vmaxps / vminps as its comparisons,
// a NaN lane giving the second operand), the tail by the scalar code itself.
// S provides, beyond quant_act_impl.h's: fadd, fdiv, fma(a, b, c) = a * b + c, fnmadd(a, b, c) =
// c - a * b, fmin(a, b), neg, round_even (nearbyint), pow2 (2^n of an integral n in [-126, 127]),
// inf_if_gt(x, t, v) (x > t ? +inf : v), store.
#pragma once

#include <cstdint>

#include "ops/cpu/ref_ops.h"

namespace tandem::kern::detail {
namespace {

template <class S>
inline typename S::F exp_for_silu_simd(typename S::F x) {
  namespace c = ops::silu_exp;
  using F = typename S::F;
  const F a = S::fmin(S::max(x, S::set1(c::kLow)), S::set1(c::kHigh));
  const F n = S::round_even(S::mul(a, S::set1(c::kLog2e)));
  F r = S::fnmadd(n, S::set1(c::kLn2Hi), a);
  r = S::fnmadd(n, S::set1(c::kLn2Lo), r);
  F p = S::set1(c::kP[0]);
  for (int i = 1; i < 6; ++i) p = S::fma(p, r, S::set1(c::kP[i]));
  p = S::fma(p, S::mul(r, r), S::fadd(r, S::set1(1.0f)));
  return S::inf_if_gt(x, S::set1(c::kHigh), S::mul(p, S::pow2(n)));
}

template <class S>
void swiglu_impl(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + S::kLanes <= n; i += S::kLanes) {
    const typename S::F x = S::load(gate + i);
    const typename S::F d = S::fadd(S::set1(1.0f), exp_for_silu_simd<S>(S::neg(x)));
    S::store(out + i, S::mul(S::fdiv(x, d), S::load(up + i)));
  }
  for (; i < n; ++i) out[i] = ops::silu(gate[i]) * up[i];
}

}  // namespace
}  // namespace tandem::kern::detail
