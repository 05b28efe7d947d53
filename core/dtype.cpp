#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "core/error.h"

namespace tandem {
namespace {

// ggml type ids are from ggml.h (enum ggml_type); block sizes from ggml-common.h.
constexpr std::array<DTypeInfo, static_cast<size_t>(DType::kCount)> kInfo = {{
    {DType::kF32, "f32", 1, 4, 0, true, false},
    {DType::kF16, "f16", 1, 2, 1, true, false},
    {DType::kBF16, "bf16", 1, 2, 30, true, false},
    {DType::kF8E4M3, "f8_e4m3", 1, 1, -1, true, false},
    {DType::kI8, "i8", 1, 1, 24, false, false},
    {DType::kU8, "u8", 1, 1, -1, false, false},
    {DType::kI16, "i16", 1, 2, 25, false, false},
    {DType::kI32, "i32", 1, 4, 26, false, false},
    {DType::kI64, "i64", 1, 8, 27, false, false},
    {DType::kF64, "f64", 1, 8, 28, true, false},
    {DType::kQ4_0, "q4_0", 32, 18, 2, false, true},
    {DType::kQ4_1, "q4_1", 32, 20, 3, false, true},
    {DType::kQ5_0, "q5_0", 32, 22, 6, false, true},
    {DType::kQ5_1, "q5_1", 32, 24, 7, false, true},
    {DType::kQ8_0, "q8_0", 32, 34, 8, false, true},
    {DType::kQ8_1, "q8_1", 32, 36, 9, false, true},
    {DType::kQ2_K, "q2_K", 256, 84, 10, false, true},
    {DType::kQ3_K, "q3_K", 256, 110, 11, false, true},
    {DType::kQ4_K, "q4_K", 256, 144, 12, false, true},
    {DType::kQ5_K, "q5_K", 256, 176, 13, false, true},
    {DType::kQ6_K, "q6_K", 256, 210, 14, false, true},
    {DType::kQ8_K, "q8_K", 256, 292, 15, false, true},
    {DType::kMXFP4, "mxfp4", 32, 17, 39, false, true},
}};

constexpr bool table_in_order() {
  for (size_t i = 0; i < kInfo.size(); ++i) {
    if (static_cast<size_t>(kInfo[i].dtype) != i) return false;
  }
  return true;
}
static_assert(table_in_order(), "kInfo must list dtypes in enum order");

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

const DTypeInfo& dtype_info(DType dtype) {
  const auto index = static_cast<size_t>(dtype);
  TD_CHECK(index < kInfo.size(), "dtype id {}", index);
  return kInfo[index];
}

std::optional<DType> dtype_from_ggml(int32_t ggml_type) {
  for (const DTypeInfo& info : kInfo) {
    if (info.ggml_type >= 0 && info.ggml_type == ggml_type) return info.dtype;
  }
  return std::nullopt;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DTypeInfo& info : kInfo) {
    if (iequals(info.name, name)) return info.dtype;
  }
  return std::nullopt;
}

}  // namespace tandem
