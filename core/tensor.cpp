#include "core/tensor.h"

#include <fmt/format.h>

#include "core/error.h"

namespace tandem {

Tensor Tensor::dense(DType dtype, std::initializer_list<int64_t> dims, void* data,
                     DeviceRef device) {
  TD_CHECK(dims.size() <= kMaxDims, "{} dims", dims.size());
  Tensor t;
  t.dtype = dtype;
  t.ndim = static_cast<int>(dims.size());
  int i = 0;
  for (int64_t d : dims) t.shape[i++] = d;
  if (t.ndim) t.stride_bytes[t.ndim - 1] = dtype_info(dtype).block_bytes;
  // the row size, then each outer dimension multiplies by the extent inside it
  int64_t s = t.ndim ? dtype_bytes(dtype, t.shape[t.ndim - 1]) : 0;
  for (int d = t.ndim - 2; d >= 0; --d) {
    t.stride_bytes[d] = s;
    s *= t.shape[d];
  }
  t.data = data;
  t.device = device;
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t s = ndim ? row_bytes() : 0;
  for (int d = ndim - 2; d >= 0; --d) {
    if (stride_bytes[d] != s) return false;
    s *= shape[d];
  }
  return true;
}

int64_t Tensor::nbytes() const { return ndim == 0 ? dtype_info(dtype).block_bytes : rows() * row_bytes(); }

Tensor Tensor::slice0(int64_t i) const {
  TD_CHECK(ndim >= 1 && i >= 0 && i < shape[0], "slice {} of {}", i, shape_string());
  Tensor t;
  t.dtype = dtype;
  t.ndim = ndim - 1;
  for (int d = 1; d < ndim; ++d) {
    t.shape[d - 1] = shape[d];
    t.stride_bytes[d - 1] = stride_bytes[d];
  }
  t.data = static_cast<char*>(data) + i * stride_bytes[0];
  t.device = device;
  return t;
}

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

}  // namespace tandem
