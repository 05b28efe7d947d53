// Tensor views: dtype, shape, row strides, data pointer and where the data lives. A view never
// owns memory (the owner is an mmap'ed file, an arena or a device allocation).
//
// Shapes are row-major as in PyTorch / Hugging Face: shape[ndim-1] is the innermost, contiguous
// dimension, so a weight [out_features, in_features] is out_features rows of in_features values.
// (GGUF lists `ne` innermost first; formats/gguf reverses it.) For block-quantized dtypes the
// innermost dimension is a whole number of blocks and only whole rows are addressable.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace tandem {

enum class DeviceKind : uint8_t { kCpu, kAccel };

struct DeviceRef {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;  // NUMA node for kCpu (-1: any), accelerator ordinal for kAccel
};

inline constexpr int kMaxDims = 4;

struct Tensor {
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  // Byte distance between consecutive indices of each dimension; the innermost is always dense.
  std::array<int64_t, kMaxDims> stride_bytes{};
  void* data = nullptr;
  DeviceRef device;

  // A dense tensor over `data`.
  static Tensor dense(DType dtype, std::initializer_list<int64_t> shape, void* data,
                      DeviceRef device = {});

  int64_t numel() const;
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  int64_t rows() const { return ndim == 0 ? 1 : numel() / shape[ndim - 1]; }
  int64_t row_elems() const { return ndim == 0 ? 1 : shape[ndim - 1]; }
  int64_t row_bytes() const { return dtype_bytes(dtype, row_elems()); }
  bool is_contiguous() const;
  int64_t nbytes() const;  // of a contiguous tensor

  // Pointer to row `r` of a tensor viewed as [rows, row_elems].
  template <typename T = void>
  T* row(int64_t r) const {
    return reinterpret_cast<T*>(static_cast<char*>(data) + r * row_bytes());
  }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }

  // The sub-tensor at index i of the outermost dimension (e.g. one expert of a stacked tensor).
  Tensor slice0(int64_t i) const;

  std::string shape_string() const;  // "[2048, 7168]"
};

}  // namespace tandem
