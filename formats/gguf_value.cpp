// GgufValue: typed access to GGUF metadata values and the constructors the writer uses.
#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "formats/gguf.h"

namespace tandem {
namespace {

bool is_signed_int(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 ||
         t == GgufType::kInt64;
}
bool is_unsigned_int(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64;
}

}  // namespace

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const {
  return is_signed_int(type_) || is_unsigned_int(type_);
}

GgufType GgufValue::array_type() const {
  if (type_ != GgufType::kArray)
    fail(ErrorKind::kFormat, "expected an array, got {}", gguf_type_name(type_));
  return array_type_;
}

int64_t GgufValue::as_int() const {
  if (is_signed_int(type_) || type_ == GgufType::kBool) return static_cast<int64_t>(bits_);
  if (is_unsigned_int(type_)) {
    if (bits_ > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(ErrorKind::kFormat, "value {} does not fit in int64", bits_);
    }
    return static_cast<int64_t>(bits_);
  }
  fail(ErrorKind::kFormat, "expected an integer, got {}", gguf_type_name(type_));
}

uint64_t GgufValue::as_uint() const {
  if (is_unsigned_int(type_) || type_ == GgufType::kBool) return bits_;
  if (is_signed_int(type_)) {
    const auto v = static_cast<int64_t>(bits_);
    if (v < 0) fail(ErrorKind::kFormat, "expected a non-negative integer, got {}", v);
    return static_cast<uint64_t>(v);
  }
  fail(ErrorKind::kFormat, "expected an unsigned integer, got {}", gguf_type_name(type_));
}

double GgufValue::as_float() const {
  if (type_ == GgufType::kFloat32) return std::bit_cast<float>(static_cast<uint32_t>(bits_));
  if (type_ == GgufType::kFloat64) return std::bit_cast<double>(bits_);
  if (is_signed_int(type_)) return static_cast<double>(static_cast<int64_t>(bits_));
  if (is_unsigned_int(type_)) return static_cast<double>(bits_);
  fail(ErrorKind::kFormat, "expected a number, got {}", gguf_type_name(type_));
}

bool GgufValue::as_bool() const {
  if (type_ == GgufType::kBool || is_integer()) return bits_ != 0;
  fail(ErrorKind::kFormat, "expected a bool, got {}", gguf_type_name(type_));
}

const std::string& GgufValue::as_string() const {
  if (type_ != GgufType::kString)
    fail(ErrorKind::kFormat, "expected a string, got {}", gguf_type_name(type_));
  return str_;
}

size_t GgufValue::size() const {
  if (type_ != GgufType::kArray)
    fail(ErrorKind::kFormat, "expected an array, got {}", gguf_type_name(type_));
  return items_.size();
}

const GgufValue& GgufValue::at(size_t i) const {
  if (i >= size())
    fail(ErrorKind::kFormat, "array index {} out of range (size {})", i, items_.size());
  return items_[i];
}

std::vector<int64_t> GgufValue::as_int_array() const {
  const GgufType t = array_type();
  if (!is_signed_int(t) && !is_unsigned_int(t) && t != GgufType::kBool) {
    fail(ErrorKind::kFormat, "expected an array of integers, got an array of {}",
         gguf_type_name(t));
  }
  std::vector<int64_t> out;
  out.reserve(items_.size());
  for (const GgufValue& v : items_) out.push_back(v.as_int());
  return out;
}

std::vector<float> GgufValue::as_float_array() const {
  const GgufType t = array_type();
  if (t == GgufType::kString || t == GgufType::kArray || t == GgufType::kBool) {
    fail(ErrorKind::kFormat, "expected an array of numbers, got an array of {}", gguf_type_name(t));
  }
  std::vector<float> out;
  out.reserve(items_.size());
  for (const GgufValue& v : items_) out.push_back(static_cast<float>(v.as_float()));
  return out;
}

std::vector<std::string> GgufValue::as_string_array() const {
  const GgufType t = array_type();
  if (t != GgufType::kString) {
    fail(ErrorKind::kFormat, "expected an array of strings, got an array of {}", gguf_type_name(t));
  }
  std::vector<std::string> out;
  out.reserve(items_.size());
  for (const GgufValue& v : items_) out.push_back(v.str_);
  return out;
}

// Constructors: integers are stored sign-extended, floats as their raw bits so that a value read
// from a file is written back bit for bit (NaN payloads included).
#define TD_GGUF_INT_CTOR(fn, ctype, tag)                        \
  GgufValue GgufValue::fn(ctype v) {                            \
    GgufValue out;                                              \
    out.type_ = GgufType::tag;                                  \
    out.bits_ = static_cast<uint64_t>(static_cast<int64_t>(v)); \
    return out;                                                 \
  }
TD_GGUF_INT_CTOR(u8, uint8_t, kUint8)
TD_GGUF_INT_CTOR(i8, int8_t, kInt8)
TD_GGUF_INT_CTOR(u16, uint16_t, kUint16)
TD_GGUF_INT_CTOR(i16, int16_t, kInt16)
TD_GGUF_INT_CTOR(u32, uint32_t, kUint32)
TD_GGUF_INT_CTOR(i32, int32_t, kInt32)
TD_GGUF_INT_CTOR(i64, int64_t, kInt64)
#undef TD_GGUF_INT_CTOR

GgufValue GgufValue::u64(uint64_t v) {
  GgufValue out;
  out.type_ = GgufType::kUint64;
  out.bits_ = v;
  return out;
}

GgufValue GgufValue::f32(float v) {
  GgufValue out;
  out.type_ = GgufType::kFloat32;
  out.bits_ = std::bit_cast<uint32_t>(v);
  return out;
}

GgufValue GgufValue::f64(double v) {
  GgufValue out;
  out.type_ = GgufType::kFloat64;
  out.bits_ = std::bit_cast<uint64_t>(v);
  return out;
}

GgufValue GgufValue::boolean(bool v) {
  GgufValue out;
  out.type_ = GgufType::kBool;
  out.bits_ = v ? 1 : 0;
  return out;
}

GgufValue GgufValue::string(std::string v) {
  GgufValue out;
  out.type_ = GgufType::kString;
  out.str_ = std::move(v);
  return out;
}

GgufValue GgufValue::array(GgufType elem_type, std::vector<GgufValue> elems) {
  if (gguf_type_name(elem_type) == "unknown") {
    fail(ErrorKind::kInvalidArgument, "GGUF array: unknown element type {}",
         static_cast<uint32_t>(elem_type));
  }
  for (size_t i = 0; i < elems.size(); ++i) {
    if (elems[i].type_ != elem_type) {
      fail(ErrorKind::kInvalidArgument, "GGUF array of {}: element {} is a {}",
           gguf_type_name(elem_type), i, gguf_type_name(elems[i].type_));
    }
  }
  GgufValue out;
  out.type_ = GgufType::kArray;
  out.array_type_ = elem_type;
  out.items_ = std::move(elems);
  return out;
}

GgufValue GgufValue::string_array(const std::vector<std::string>& v) {
  std::vector<GgufValue> items;
  items.reserve(v.size());
  for (const std::string& s : v) items.push_back(string(s));
  return array(GgufType::kString, std::move(items));
}

GgufValue GgufValue::i32_array(const std::vector<int32_t>& v) {
  std::vector<GgufValue> items;
  items.reserve(v.size());
  for (int32_t x : v) items.push_back(i32(x));
  return array(GgufType::kInt32, std::move(items));
}

GgufValue GgufValue::f32_array(const std::vector<float>& v) {
  std::vector<GgufValue> items;
  items.reserve(v.size());
  for (float x : v) items.push_back(f32(x));
  return array(GgufType::kFloat32, std::move(items));
}

bool GgufValue::operator==(const GgufValue& other) const {
  if (type_ != other.type_) return false;
  switch (type_) {
    case GgufType::kString:
      return str_ == other.str_;
    case GgufType::kArray:
      return array_type_ == other.array_type_ && items_ == other.items_;
    default:
      return bits_ == other.bits_;
  }
}

std::string GgufValue::to_string(size_t max_items) const {
  switch (type_) {
    case GgufType::kString:
      return fmt::format("\"{}\"", printable(str_));
    case GgufType::kBool:
      return bits_ ? "true" : "false";
    case GgufType::kFloat32:
    case GgufType::kFloat64:
      return fmt::format("{}", as_float());
    case GgufType::kArray: {
      std::string s = "[";
      for (size_t i = 0; i < items_.size() && i < max_items; ++i) {
        s += (i ? ", " : "") + items_[i].to_string(max_items);
      }
      if (items_.size() > max_items) s += fmt::format(", ... ({} items)", items_.size());
      return s + "]";
    }
    default:
      return is_signed_int(type_) ? fmt::format("{}", static_cast<int64_t>(bits_))
                                  : fmt::format("{}", bits_);
  }
}

}  // namespace tandem
