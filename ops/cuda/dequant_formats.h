// The one place where a runtime DType becomes a decoder of dequant_decode.h, i.e. a kernel's
// template argument (dequant.cu, matvec.cu) or a host check's (the gpu tests). Plain C++.
#pragma once

#include "core/dtype.h"
#include "ops/cuda/dequant_decode.h"

namespace tandem::dequant {

template <typename Fmt>
struct FormatTag {
  using type = Fmt;
};

// Calls f(FormatTag<Fmt>{}) for the decoder of `type`; returns false for unsupported types.
template <typename F>
bool visit_format(DType type, F&& f) {
  auto call = [&f](auto tag) {
    f(tag);
    return true;
  };
  switch (type) {
    case DType::kF32:
      return call(FormatTag<F32>{});
    case DType::kF16:
      return call(FormatTag<F16>{});
    case DType::kBF16:
      return call(FormatTag<BF16>{});
    case DType::kF8E4M3:
      return call(FormatTag<F8E4M3>{});
    case DType::kQ4_0:
      return call(FormatTag<Q4_0>{});
    case DType::kQ4_1:
      return call(FormatTag<Q4_1>{});
    case DType::kQ5_0:
      return call(FormatTag<Q5_0>{});
    case DType::kQ5_1:
      return call(FormatTag<Q5_1>{});
    case DType::kQ8_0:
      return call(FormatTag<Q8_0>{});
    case DType::kQ8_1:
      return call(FormatTag<Q8_1>{});
    case DType::kQ2_K:
      return call(FormatTag<Q2_K>{});
    case DType::kQ3_K:
      return call(FormatTag<Q3_K>{});
    case DType::kQ4_K:
      return call(FormatTag<Q4_K>{});
    case DType::kQ5_K:
      return call(FormatTag<Q5_K>{});
    case DType::kQ6_K:
      return call(FormatTag<Q6_K>{});
    case DType::kQ8_K:
      return call(FormatTag<Q8_K>{});
    case DType::kMXFP4:
      return call(FormatTag<MXFP4>{});
    default:
      return false;
  }
}

}  // namespace tandem::dequant
