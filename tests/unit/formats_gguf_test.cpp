// GGUF reader/writer: exact bytes of a hand-built file, round trips of every metadata type, the
// llama.cpp-written golden and vocab files, a byte-identical rewrite, and every validation error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Appends little-endian scalars / GGUF strings to a byte vector (the independent encoder).
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& pad(size_t align) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
};

// Writes `w` and returns its bytes.
std::vector<uint8_t> write_and_read(GgufWriter& w, const fs::path& p) {
  w.write();
  return read_bytes(p);
}

// Expects parse() to throw Error of `kind` whose message contains every one of `needles`.
void expect_error(const std::vector<uint8_t>& bytes, ErrorKind kind,
                  std::initializer_list<std::string> needles) {
  try {
    GgufFile::parse("bad.gguf", bytes.data(), bytes.size());
    ADD_FAILURE() << "parse succeeded, expected an error containing " << *needles.begin();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.gguf"), std::string::npos) << msg;
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

// Position of the first occurrence of `s` (as raw bytes) in `b`.
size_t find_bytes(const std::vector<uint8_t>& b, const std::string& s) {
  auto it = std::search(b.begin(), b.end(), s.begin(), s.end());
  EXPECT_NE(it, b.end()) << s;
  return static_cast<size_t>(it - b.begin());
}

template <typename T>
void poke(std::vector<uint8_t>& b, size_t pos, T v) {
  std::memcpy(b.data() + pos, &v, sizeof(T));
}

TEST(GgufWriter, ExactBytesOfASmallFile) {
  test::TempDir dir("gguf");
  GgufWriter w(dir / "a.gguf");
  w.set("general.architecture", GgufValue::string("llama"));
  w.set("x.count", GgufValue::u32(7));
  w.set("x.list", GgufValue::i32_array({-1, 2}));
  const float values[3] = {1.0f, -2.5f, 3.25f};
  w.add_tensor_data("w", DType::kF32, {3}, values);
  w.add_tensor("h", DType::kF16, {2, 2}, [](void* dst) {
    const uint16_t v[4] = {0x3c00, 0x4000, 0xbc00, 0x0000};  // 1, 2, -1, 0
    std::memcpy(dst, v, sizeof v);
  });

  Bytes e;
  e.put<uint32_t>(0x46554747).put<uint32_t>(3).put<uint64_t>(2).put<uint64_t>(3);
  e.str("general.architecture").put<uint32_t>(8).str("llama");
  e.str("x.count").put<uint32_t>(4).put<uint32_t>(7);
  e.str("x.list").put<uint32_t>(9).put<uint32_t>(5).put<uint64_t>(2).put<int32_t>(-1).put<int32_t>(
      2);
  e.str("w").put<uint32_t>(1).put<uint64_t>(3).put<uint32_t>(0).put<uint64_t>(0);
  // GGUF lists ne innermost first: the row-major [2, 2] becomes ne = {2, 2}; offset 12 -> 32.
  e.str("h").put<uint32_t>(2).put<uint64_t>(2).put<uint64_t>(2).put<uint32_t>(1).put<uint64_t>(32);
  e.pad(32);
  for (float v : values) e.put(v);
  e.pad(32);
  for (uint16_t v : {0x3c00, 0x4000, 0xbc00, 0x0000}) e.put<uint16_t>(v);
  e.pad(32);
  EXPECT_EQ(write_and_read(w, dir / "a.gguf"), e.b);
  EXPECT_FALSE(fs::exists(dir / "a.gguf.tmp"));

  // And the reader sees exactly that.
  const GgufFile f = GgufFile::open(dir / "a.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_string("general.architecture", ""), "llama");
  EXPECT_EQ(f.get_int("x.count", 0), 7);
  EXPECT_EQ(f.get("x.list").as_int_array(), (std::vector<int64_t>{-1, 2}));
  ASSERT_EQ(f.tensors().size(), 2u);
  const size_t data_start = (e.b.size() - 32 - 32);
  EXPECT_EQ(f.data_offset(), data_start);
  const Tensor t = f.tensor("w");
  EXPECT_EQ(t.ndim, 1);
  EXPECT_EQ(t.shape[0], 3);
  EXPECT_EQ(t.as<float>()[1], -2.5f);
  const Tensor h = f.tensor("h");
  EXPECT_EQ(h.dtype, DType::kF16);
  EXPECT_EQ(h.shape_string(), "[2, 2]");
  EXPECT_EQ(h.stride_bytes[0], 4);
  EXPECT_EQ(h.stride_bytes[1], 2);
  EXPECT_EQ(h.row<uint16_t>(1)[0], 0xbc00);
  EXPECT_EQ(f.find_tensor("h")->offset, data_start + 32);
  EXPECT_EQ(f.find_tensor("h")->nbytes, 8u);
}

GgufValue nested(int depth) {
  GgufValue v = GgufValue::i32_array({depth});
  for (int i = 1; i < depth; ++i) v = GgufValue::array(GgufType::kArray, {v});
  return v;
}

TEST(GgufWriter, RoundTripsEveryMetadataTypeAndDtype) {
  test::TempDir dir("gguf");
  std::vector<std::pair<std::string, GgufValue>> kv = {
      {"u8", GgufValue::u8(255)},
      {"i8", GgufValue::i8(-128)},
      {"u16", GgufValue::u16(65535)},
      {"i16", GgufValue::i16(-32768)},
      {"u32", GgufValue::u32(4000000000u)},
      {"i32", GgufValue::i32(std::numeric_limits<int32_t>::min())},
      {"u64", GgufValue::u64(std::numeric_limits<uint64_t>::max())},
      {"i64", GgufValue::i64(std::numeric_limits<int64_t>::min())},
      {"f32", GgufValue::f32(-1.5e-7f)},
      {"f32.nan", GgufValue::f32(std::numeric_limits<float>::quiet_NaN())},
      {"f64", GgufValue::f64(3.141592653589793)},
      {"bool.t", GgufValue::boolean(true)},
      {"bool.f", GgufValue::boolean(false)},
      {"str.empty", GgufValue::string("")},
      {"str.unicode", GgufValue::string("h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80")},
      {"str.nul", GgufValue::string(std::string("a\0b", 3))},
      {"arr.empty", GgufValue::array(GgufType::kFloat64, {})},
      {"arr.strings", GgufValue::string_array({"", "\xc3\xa9", "token"})},
      {"arr.f32", GgufValue::f32_array({0.5f, -0.25f})},
      {"arr.bool",
       GgufValue::array(GgufType::kBool, {GgufValue::boolean(true), GgufValue::boolean(false)})},
      {"arr.u64", GgufValue::array(GgufType::kUint64, {GgufValue::u64(1ull << 63)})},
      {"arr.nested", GgufValue::array(GgufType::kArray,
                                      {GgufValue::i32_array({1, 2}), GgufValue::string_array({"x"}),
                                       GgufValue::array(GgufType::kInt8, {})})},
      {"arr.deep8", nested(8)},
  };
  GgufWriter w(dir / "all.gguf", 64);
  for (const auto& [k, v] : kv) w.set(k, v);
  w.set("u8", GgufValue::u8(254));  // replaces in place, keeps the order
  kv[0].second = GgufValue::u8(254);

  struct T {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  const std::vector<T> specs = {
      {"f32", DType::kF32, {3, 5}},      {"f16", DType::kF16, {7}},
      {"bf16", DType::kBF16, {2, 3, 4}}, {"q8_0", DType::kQ8_0, {2, 64}},
      {"q4_k", DType::kQ4_K, {3, 256}},  {"i32", DType::kI32, {1, 1, 1, 9}},
      {"f64", DType::kF64, {2}},         {"i8", DType::kI8, {33}}};
  auto pattern = [](const std::string& name, size_t i) {
    return static_cast<uint8_t>(i * 131 + name.size() * 7 + 1);
  };
  for (const T& s : specs) {
    w.add_tensor(s.name, s.dtype, s.shape,
                 [&, name = s.name, shape = s.shape, dt = s.dtype](void* dst) {
                   int64_t n = 1;
                   for (int64_t d : shape) n *= d;
                   auto* p = static_cast<uint8_t*>(dst);
                   for (int64_t i = 0; i < dtype_bytes(dt, n); ++i) p[i] = pattern(name, i);
                 });
  }
  w.write();

  const GgufFile f = GgufFile::open(dir / "all.gguf");
  EXPECT_EQ(f.alignment(), 64u);
  ASSERT_EQ(f.metadata().size(), kv.size() + 1);  // + general.alignment, recorded first
  EXPECT_EQ(f.metadata()[0].first, "general.alignment");
  EXPECT_EQ(f.metadata()[0].second, GgufValue::u32(64));
  for (size_t i = 0; i < kv.size(); ++i) {
    EXPECT_EQ(f.metadata()[i + 1].first, kv[i].first);
    EXPECT_EQ(f.metadata()[i + 1].second, kv[i].second) << kv[i].first;
  }
  EXPECT_EQ(f.get("u64").as_uint(), std::numeric_limits<uint64_t>::max());
  EXPECT_THROW(f.get("u64").as_int(), Error);
  EXPECT_EQ(f.get("i64").as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_THROW(f.get("i8").as_uint(), Error);
  EXPECT_EQ(f.get("i16").as_int(), -32768);
  EXPECT_EQ(f.get("u32").as_int(), 4000000000LL);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get("f32").as_float()), -1.5e-7f);
  EXPECT_TRUE(std::isnan(f.get("f32.nan").as_float()));
  EXPECT_DOUBLE_EQ(f.get_float("f64", 0), 3.141592653589793);
  EXPECT_DOUBLE_EQ(f.get_float("u16", 0), 65535.0);
  EXPECT_TRUE(f.get_bool("bool.t", false));
  EXPECT_FALSE(f.get_bool("bool.f", true));
  EXPECT_EQ(f.get("str.nul").as_string().size(), 3u);
  EXPECT_EQ(f.get("str.unicode").as_string(), kv[14].second.as_string());
  EXPECT_EQ(f.get("arr.empty").size(), 0u);
  EXPECT_EQ(f.get("arr.empty").array_type(), GgufType::kFloat64);
  EXPECT_EQ(f.get("arr.strings").as_string_array(),
            (std::vector<std::string>{"", "\xc3\xa9", "token"}));
  EXPECT_EQ(f.get("arr.f32").as_float_array(), (std::vector<float>{0.5f, -0.25f}));
  EXPECT_EQ(f.get("arr.bool").as_int_array(), (std::vector<int64_t>{1, 0}));
  const GgufValue& n = f.get("arr.nested");
  EXPECT_EQ(n.array_type(), GgufType::kArray);
  ASSERT_EQ(n.size(), 3u);
  EXPECT_EQ(n.at(0).as_int_array(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(n.at(1).at(0).as_string(), "x");
  EXPECT_EQ(n.at(2).array_type(), GgufType::kInt8);
  EXPECT_THROW(n.at(3), Error);
  const GgufValue* deep = &f.get("arr.deep8");
  for (int i = 1; i < 8; ++i) deep = &deep->at(0);
  EXPECT_EQ(deep->as_int_array(), (std::vector<int64_t>{8}));

  ASSERT_EQ(f.tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const GgufTensorInfo& info = f.tensors()[i];
    EXPECT_EQ(info.name, specs[i].name);
    EXPECT_EQ(info.dtype, specs[i].dtype);
    ASSERT_EQ(info.ndim, static_cast<int>(specs[i].shape.size()));
    for (int d = 0; d < info.ndim; ++d) EXPECT_EQ(info.shape[d], specs[i].shape[d]);
    EXPECT_EQ(info.offset % 64, 0u);
    const Tensor t = f.tensor(info.name);
    EXPECT_EQ(t.nbytes(), static_cast<int64_t>(info.nbytes));
    const auto* p = static_cast<const uint8_t*>(t.data);
    for (uint64_t j = 0; j < info.nbytes; ++j) ASSERT_EQ(p[j], pattern(info.name, j)) << info.name;
  }
  // q8_0 [2, 64]: 2 rows of 2 blocks of 34 bytes; q4_K [3, 256]: 3 rows of one 144-byte block.
  EXPECT_EQ(f.find_tensor("q8_0")->nbytes, 2u * 2 * 34);
  EXPECT_EQ(f.find_tensor("q4_k")->nbytes, 3u * 144);
  EXPECT_EQ(f.size() % 64, 0u);
}

TEST(GgufFile, TypedGettersNameKeyAndFile) {
  test::TempDir dir("gguf");
  GgufWriter w(dir / "g.gguf");
  w.set("name", GgufValue::string("x"));
  w.set("n", GgufValue::i16(-3));
  w.write();
  const GgufFile f = GgufFile::open(dir / "g.gguf");
  EXPECT_EQ(f.get_int("absent", 42), 42);
  EXPECT_EQ(f.get_int("n", 0), -3);
  EXPECT_EQ(f.get_string("absent", "fb"), "fb");
  EXPECT_EQ(f.find("absent"), nullptr);
  EXPECT_TRUE(f.tensors().empty());
  for (auto call : {+[](const GgufFile& g) { g.get_int("name", 0); },
                    +[](const GgufFile& g) { g.get("missing.key"); },
                    +[](const GgufFile& g) { g.get_string("n", ""); },
                    +[](const GgufFile& g) { g.tensor("nope"); }}) {
    try {
      call(f);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("g.gguf"), std::string::npos) << e.what();
    }
  }
  try {
    f.get_int("name", 0);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'name'"), std::string::npos) << e.what();
  }
}

TEST(GgufWriter, RejectsBadTensorsAndCleansUp) {
  test::TempDir dir("gguf");
  GgufWriter w(dir / "w.gguf");
  w.add_tensor("a", DType::kF32, {4}, nullptr);
  EXPECT_THROW(w.add_tensor("a", DType::kF32, {4}, nullptr), Error);              // duplicate
  EXPECT_THROW(w.add_tensor("b", DType::kF32, {}, nullptr), Error);               // 0 dims
  EXPECT_THROW(w.add_tensor("b", DType::kF32, {1, 1, 1, 1, 1}, nullptr), Error);  // 5 dims
  EXPECT_THROW(w.add_tensor("b", DType::kF32, {2, 0}, nullptr), Error);           // zero extent
  EXPECT_THROW(w.add_tensor("b", DType::kQ8_0, {2, 48}, nullptr), Error);         // not blocks
  try {
    w.add_tensor("fp8", DType::kF8E4M3, {4}, nullptr);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  }
  EXPECT_THROW(GgufWriter(dir / "x.gguf", 48), Error);
  EXPECT_THROW(w.set("general.alignment", GgufValue::u64(64)), Error);
  EXPECT_THROW(GgufValue::array(GgufType::kInt32, {GgufValue::u8(1)}), Error);

  // A fill that throws leaves neither the file nor the temporary behind.
  w.add_tensor("boom", DType::kF32, {1}, [](void*) { throw std::runtime_error("fill failed"); });
  EXPECT_THROW(w.write(), std::runtime_error);
  EXPECT_FALSE(fs::exists(dir / "w.gguf"));
  EXPECT_FALSE(fs::exists(dir / "w.gguf.tmp"));

  GgufWriter nowhere(dir / "no" / "such" / "dir.gguf");
  try {
    nowhere.write();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("dir.gguf"), std::string::npos);
  }
}

// A valid file used as the base of the corruption tests: 2 keys, tensors "alpha" (f32 [2, 8])
// and "beta_" (f32 [8]); the last tensor ends exactly at the end of the file.
std::vector<uint8_t> base_file(const test::TempDir& dir) {
  GgufWriter w(dir / "base.gguf");
  w.set("general.architecture", GgufValue::string("llama"));
  w.set("keyb", GgufValue::string_array({"one", "two"}));
  w.add_tensor("alpha", DType::kF32, {2, 8}, nullptr);
  w.add_tensor("beta_", DType::kF32, {8}, nullptr);
  return write_and_read(w, dir / "base.gguf");
}

TEST(GgufFile, EveryTruncationIsAnError) {
  test::TempDir dir("gguf");
  const std::vector<uint8_t> good = base_file(dir);
  ASSERT_NO_THROW(GgufFile::parse("bad.gguf", good.data(), good.size()));
  for (size_t len = 0; len < good.size(); ++len) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + len);
    try {
      GgufFile::parse("bad.gguf", cut.data(), cut.size());
      ADD_FAILURE() << "truncated to " << len << " bytes parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kFormat) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.gguf"), std::string::npos);
    }
  }
  const size_t beta = find_bytes(good, "beta_");
  expect_error({good.begin(), good.begin() + beta + 7}, ErrorKind::kFormat,
               {"tensor 'beta_'", "truncated"});
}

TEST(GgufFile, HeaderErrors) {
  test::TempDir dir("gguf");
  const std::vector<uint8_t> good = base_file(dir);
  auto b = good;
  b[0] = 'X';
  expect_error(b, ErrorKind::kFormat, {"not a GGUF file"});
  b = good;
  poke<uint32_t>(b, 4, 1);
  expect_error(b, ErrorKind::kUnsupported, {"version 1"});
  poke<uint32_t>(b, 4, 4);
  expect_error(b, ErrorKind::kUnsupported, {"version 4"});
  poke<uint32_t>(b, 4, 0x03000000);
  expect_error(b, ErrorKind::kUnsupported, {"big-endian"});
  b = good;
  poke<uint32_t>(b, 4, 2);  // v2 has the same layout
  EXPECT_EQ(GgufFile::parse("v2", b.data(), b.size()).version(), 2u);
  b = good;
  poke<uint64_t>(b, 8, 1ull << 60);  // n_tensors
  expect_error(b, ErrorKind::kFormat, {"cannot fit"});
  b = good;
  poke<uint64_t>(b, 16, 1ull << 62);  // n_kv
  expect_error(b, ErrorKind::kFormat, {"cannot fit"});
}

TEST(GgufFile, MetadataErrors) {
  test::TempDir dir("gguf");
  const std::vector<uint8_t> good = base_file(dir);
  const size_t arch = find_bytes(good, "general.architecture");
  auto b = good;
  poke<uint64_t>(b, arch - 8, 1ull << 40);  // key length
  expect_error(b, ErrorKind::kFormat, {"length", "exceeds"});
  b = good;
  poke<uint32_t>(b, arch + 20, 13);  // value type
  expect_error(b, ErrorKind::kFormat, {"general.architecture", "unknown metadata value type 13"});
  b = good;
  poke<uint64_t>(b, arch + 24, 1ull << 50);  // string value length
  expect_error(b, ErrorKind::kFormat, {"general.architecture", "exceeds"});
  const size_t keyb = find_bytes(good, "keyb");
  b = good;
  poke<uint32_t>(b, keyb + 8, 99);  // array element type
  expect_error(b, ErrorKind::kFormat, {"keyb", "unknown array element type 99"});
  b = good;
  poke<uint64_t>(b, keyb + 12, 1ull << 61);  // array count
  expect_error(b, ErrorKind::kFormat, {"keyb", "cannot fit"});

  // Duplicate keys, nesting, and general.alignment checks, built with the writer.
  GgufWriter w(dir / "dup.gguf");
  w.set("aaaa", GgufValue::u8(1));
  w.set("bbbb", GgufValue::u8(2));
  b = write_and_read(w, dir / "dup.gguf");
  std::memcpy(b.data() + find_bytes(b, "bbbb"), "aaaa", 4);
  expect_error(b, ErrorKind::kFormat, {"duplicate key 'aaaa'"});

  // Arrays are bounded in total, so a file cannot expand into 72x its size of GgufValues.
  Bytes big;
  big.put<uint32_t>(0x46554747).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1);
  big.str("big").put<uint32_t>(9).put<uint32_t>(0).put<uint64_t>((1u << 23) + 1);
  big.b.resize(big.b.size() + (1u << 23) + 1);
  expect_error(big.b, ErrorKind::kFormat, {"'big'", "more than 8388608 elements"});

  GgufWriter deep(dir / "deep.gguf");
  deep.set("deep", nested(9));
  expect_error(write_and_read(deep, dir / "deep.gguf"), ErrorKind::kFormat, {"deep", "nested"});

  GgufWriter align(dir / "align.gguf");
  align.set("general.alignment", GgufValue::u32(64));
  b = write_and_read(align, dir / "align.gguf");
  poke<uint32_t>(b, find_bytes(b, "general.alignment") + 21, 48);
  expect_error(b, ErrorKind::kFormat, {"general.alignment", "power of two"});
  poke<uint32_t>(b, find_bytes(b, "general.alignment") + 17, 5);  // int32 instead of uint32
  expect_error(b, ErrorKind::kFormat, {"general.alignment", "uint32"});
}

TEST(GgufFile, TensorInfoErrors) {
  test::TempDir dir("gguf");
  const std::vector<uint8_t> good = base_file(dir);
  // Tensor info of "beta_": name, u32 n_dims (1), u64 ne[0] (8), u32 type (0), u64 offset (64).
  const size_t beta = find_bytes(good, "beta_") + 5;
  const size_t alpha = find_bytes(good, "alpha") + 5;
  EXPECT_EQ(good[beta], 1);
  auto b = good;
  poke<uint32_t>(b, beta, 0);
  expect_error(b, ErrorKind::kFormat, {"tensor 'beta_'", "0 dimensions"});
  poke<uint32_t>(b, beta, 5);
  expect_error(b, ErrorKind::kFormat, {"tensor 'beta_'", "5 dimensions"});
  b = good;
  poke<uint64_t>(b, beta + 4, 0);
  expect_error(b, ErrorKind::kFormat, {"tensor 'beta_'", "ne[0] = 0"});
  poke<uint64_t>(b, beta + 4, ~0ull);
  expect_error(b, ErrorKind::kFormat, {"tensor 'beta_'", "ne[0]"});
  b = good;
  poke<uint64_t>(b, alpha + 4, 1ull << 40);  // ne = {2^40, 2^40}: 2^80 elements
  poke<uint64_t>(b, alpha + 12, 1ull << 40);
  expect_error(b, ErrorKind::kFormat, {"tensor 'alpha'", "overflows"});
  b = good;
  poke<uint32_t>(b, beta + 12, 16);  // iq2_xxs
  expect_error(b, ErrorKind::kUnsupported, {"tensor 'beta_'", "ggml type 16", "iq2_xxs"});
  poke<uint32_t>(b, beta + 12, 12345);
  expect_error(b, ErrorKind::kUnsupported, {"tensor 'beta_'", "ggml type 12345"});
  poke<uint32_t>(b, beta + 12, 8);  // q8_0 with 8 values: not a whole block
  expect_error(b, ErrorKind::kFormat, {"tensor 'beta_'", "multiple of the q8_0 block size 32"});
  b = good;
  poke<uint64_t>(b, beta + 16, 1ull << 20);
  expect_error(b, ErrorKind::kFormat, {"tensor 'beta_'", "outside the data section"});
  poke<uint64_t>(b, beta + 16, ~0ull - 31);  // offset + nbytes would wrap around
  expect_error(b, ErrorKind::kFormat, {"tensor 'beta_'", "outside the data section"});
  poke<uint64_t>(b, beta + 16, 68);
  expect_error(b, ErrorKind::kFormat, {"tensor 'beta_'", "not a multiple of the alignment 32"});
  poke<uint64_t>(b, beta + 16, 32);
  expect_error(b, ErrorKind::kFormat, {"'alpha' and 'beta_' overlap"});
  b = good;
  std::memcpy(b.data() + beta - 5, "alpha", 5);
  expect_error(b, ErrorKind::kFormat, {"duplicate tensor 'alpha'"});
}

// Writers pad every tensor to the alignment, the last one too: more bytes after it means the
// data section does not start where general.alignment puts it (alignment 1 on 32-byte-padded
// data would read every tensor shifted).
TEST(GgufFile, DataMustStartWhereTheAlignmentSaysIt) {
  test::TempDir dir("gguf");
  GgufWriter w(dir / "a.gguf");
  w.set("general.alignment", GgufValue::u32(32));
  w.add_tensor("alpha", DType::kF32, {8}, nullptr);
  w.add_tensor("beta_", DType::kF32, {3}, nullptr);  // 12 bytes, padded to 32
  auto b = write_and_read(w, dir / "a.gguf");
  ASSERT_NO_THROW(GgufFile::parse("bad.gguf", b.data(), b.size()));
  poke<uint32_t>(b, find_bytes(b, "general.alignment") + 21, 1);
  expect_error(b, ErrorKind::kFormat, {"follow the last tensor ('beta_')", "alignment 1"});
  b.resize(b.size() + 32);  // trailing bytes at the right alignment
  poke<uint32_t>(b, find_bytes(b, "general.alignment") + 21, 32);
  expect_error(b, ErrorKind::kFormat, {"52 bytes follow the last tensor"});
}

// Keys and tensor names appear in every message: control characters in them are refused, and
// printed escaped (ANSI escape sequences must not reach the terminal).
TEST(GgufFile, NamesWithControlCharactersAreRefused) {
  test::TempDir dir("gguf");
  GgufWriter w(dir / "k.gguf");
  w.set("evil\x1b[2Jkey", GgufValue::u8(1));
  auto b = write_and_read(w, dir / "k.gguf");
  expect_error(b, ErrorKind::kFormat, {"key 'evil\\x1b[2Jkey' holds control characters"});
  GgufWriter t(dir / "t.gguf");
  t.add_tensor("a\nb", DType::kF32, {8}, nullptr);
  b = write_and_read(t, dir / "t.gguf");
  expect_error(b, ErrorKind::kFormat, {"tensor name 'a\\nb' holds control characters"});
  EXPECT_EQ(GgufValue::string(std::string("x\0\x1b\n", 4)).to_string(), "\"x\\x00\\x1b\\n\"");
}

TEST(GgufFile, MissingFileIsAnIoError) {
  try {
    GgufFile::open("/nonexistent/dir/model.gguf");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/model.gguf"), std::string::npos);
  }
}

// --- real files written by llama.cpp ---

TEST(GgufGolden, KnownFacts) {
  struct Case {
    const char* file;
    const char* arch;
    DType embd;
  };
  for (const Case& c :
       {Case{"deepseek2", "deepseek2", DType::kF32},
        Case{"deepseek2-q8_0", "deepseek2", DType::kQ8_0},
        Case{"deepseek3", "deepseek2", DType::kF32}, Case{"qwen2moe", "qwen2moe", DType::kF32},
        Case{"qwen3moe-q8_0", "qwen3moe", DType::kQ8_0}, Case{"mixtral", "llama", DType::kF32}}) {
    SCOPED_TRACE(c.file);
    const GgufFile f = GgufFile::open(test::data_path(std::string("golden/") + c.file + ".gguf"));
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.get_string("general.architecture", ""), c.arch);
    EXPECT_EQ(f.get("tokenizer.ggml.tokens").size(), 512u);
    EXPECT_EQ(f.get("tokenizer.ggml.tokens").array_type(), GgufType::kString);
    EXPECT_EQ(f.get_int(std::string(c.arch) + ".embedding_length", 0), 256);
    const GgufTensorInfo* e = f.find_tensor("token_embd.weight");
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->dtype, c.embd);
    EXPECT_EQ(e->ndim, 2);
    EXPECT_EQ(e->shape[0], 512);  // [n_vocab, n_embd] row-major
    EXPECT_EQ(e->shape[1], 256);
    EXPECT_EQ(e->nbytes, static_cast<uint64_t>(dtype_bytes(c.embd, 512 * 256)));
    // The tensors tile the data section in file order, each padded to 32 bytes.
    uint64_t end = f.data_offset();
    for (const GgufTensorInfo& t : f.tensors()) {
      EXPECT_EQ(t.offset, (end + 31) / 32 * 32) << t.name;
      end = t.offset + t.nbytes;
    }
    EXPECT_EQ(f.size(), (end + 31) / 32 * 32);
  }
  const GgufFile q4 = GgufFile::open(test::data_path("golden/deepseek2-q4_k_m.gguf"));
  std::set<DType> types;
  for (const GgufTensorInfo& t : q4.tensors()) types.insert(t.dtype);
  for (DType d : {DType::kQ4_K, DType::kQ6_K, DType::kF32})
    EXPECT_TRUE(types.count(d)) << dtype_name(d);
  EXPECT_EQ(q4.find_tensor("output.weight")->dtype, DType::kQ6_K);
  EXPECT_EQ(q4.get_int("general.file_type", -1), 15);  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  const GgufFile mix = GgufFile::open(test::data_path("golden/mixtral.gguf"));
  const GgufTensorInfo* gate = mix.find_tensor("blk.0.ffn_gate_exps.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->ndim, 3);  // [experts, ffn, embd]
  EXPECT_EQ(gate->shape[0], 8);
  EXPECT_EQ(gate->shape[1], 128);
  EXPECT_EQ(gate->shape[2], 256);
  EXPECT_EQ(mix.get("tokenizer.ggml.scores").array_type(), GgufType::kFloat32);
  EXPECT_EQ(mix.get_int("tokenizer.ggml.bos_token_id", -1), 1);
}

// Every golden GGUF (F32, Q8_0, Q4_K_M of five models): the architecture that NAME.json names,
// the 512-token vocabulary, and tensor data tiling the data section as llama.cpp lays it out.
TEST(GgufGolden, EveryGoldenFileParses) {
  size_t files = 0;
  for (const char* model : {"deepseek2", "deepseek3", "mixtral", "qwen2moe", "qwen3moe"}) {
    const auto meta =
        nlohmann::json::parse(read_text(test::data_path(std::string("golden/") + model + ".json")));
    const std::string arch = meta.at("gguf_arch").get<std::string>();
    for (const char* suffix : {"", "-q8_0", "-q4_k_m"}) {
      const std::string name = std::string("golden/") + model + suffix + ".gguf";
      SCOPED_TRACE(name);
      const GgufFile f = GgufFile::open(test::data_path(name));
      ++files;
      EXPECT_EQ(f.get_string("general.architecture", ""), arch);
      EXPECT_EQ(f.get("tokenizer.ggml.tokens").size(), 512u);
      EXPECT_EQ(f.get_int(arch + ".vocab_size", 512), 512);
      EXPECT_EQ(f.get_int("tokenizer.ggml.bos_token_id", -1),
                meta.at("bos_token_id").get<int64_t>());
      EXPECT_GT(f.tensors().size(), 20u);
      std::set<DType> types;
      uint64_t end = f.data_offset();
      for (const GgufTensorInfo& t : f.tensors()) {
        types.insert(t.dtype);
        EXPECT_EQ(t.offset, (end + 31) / 32 * 32) << t.name;
        end = t.offset + t.nbytes;
      }
      EXPECT_EQ(f.size(), (end + 31) / 32 * 32);
      if (std::string(suffix) == "-q8_0") {
        EXPECT_EQ(types, (std::set<DType>{DType::kF32, DType::kQ8_0}));
      } else if (std::string(suffix).empty()) {
        EXPECT_EQ(types, std::set<DType>{DType::kF32});
      } else {
        EXPECT_TRUE(types.count(DType::kQ4_K) && types.count(DType::kQ6_K));
      }
    }
  }
  EXPECT_EQ(files, 15u);
}

TEST(GgufGolden, F32WeightsEqualTheBf16Safetensors) {
  // The golden README: every value is BF16-representable, so the F32 GGUF and the BF16 HF
  // checkpoint hold the same numbers: each f32's top 16 bits are the bf16 and the rest is zero.
  const GgufFile f = GgufFile::open(test::data_path("golden/qwen3moe.gguf"));
  const SafetensorsModel st = SafetensorsModel::open(test::data_path("golden/qwen3moe-hf"));
  for (auto [gguf_name, hf_name] :
       {std::pair{"token_embd.weight", "model.embed_tokens.weight"},
        std::pair{"output.weight", "lm_head.weight"},
        std::pair{"blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight"}}) {
    const Tensor a = f.tensor(gguf_name);
    const Tensor b = st.tensor(hf_name);
    ASSERT_EQ(a.shape_string(), b.shape_string()) << gguf_name;
    ASSERT_EQ(b.dtype, DType::kBF16);
    const auto* x = a.as<uint32_t>();
    const auto* y = b.as<uint16_t>();
    int64_t mismatches = 0;
    for (int64_t i = 0; i < a.numel(); ++i) mismatches += (x[i] != (uint32_t{y[i]} << 16));
    EXPECT_EQ(mismatches, 0) << gguf_name;
  }
}

TEST(GgufGolden, VocabFiles) {
  struct Case {
    const char* file;
    const char* model;
    size_t n_tokens;
  };
  for (const Case& c : {Case{"ggml-vocab-deepseek-llm.gguf", "gpt2", 102400},
                        Case{"ggml-vocab-gpt-2.gguf", "gpt2", 50257},
                        Case{"ggml-vocab-llama-spm.gguf", "llama", 32000},
                        Case{"ggml-vocab-phi-3.gguf", "llama", 32064}}) {
    SCOPED_TRACE(c.file);
    const GgufFile f = GgufFile::open(test::data_path(std::string("vocab/") + c.file));
    EXPECT_TRUE(f.tensors().empty());
    EXPECT_EQ(f.get_string("tokenizer.ggml.model", ""), c.model);
    EXPECT_EQ(f.get("tokenizer.ggml.tokens").size(), c.n_tokens);
  }
  const GgufFile spm = GgufFile::open(test::data_path("vocab/ggml-vocab-llama-spm.gguf"));
  EXPECT_EQ(spm.get("tokenizer.ggml.tokens").at(1).as_string(), "<s>");
  EXPECT_EQ(spm.get("tokenizer.ggml.scores").as_float_array().size(), 32000u);
  EXPECT_TRUE(spm.get_bool("tokenizer.ggml.add_bos_token", false));
}

// Re-writing a llama.cpp file with GgufWriter (same keys, tensors, order, alignment 32) must
// reproduce it byte for byte: both pad the data section and every tensor to 32 bytes with zeros.
TEST(GgufGolden, RewriteIsByteIdentical) {
  test::TempDir dir("gguf");
  for (const char* name :
       {"golden/qwen3moe.gguf", "golden/deepseek3-q4_k_m.gguf", "vocab/ggml-vocab-phi-3.gguf"}) {
    SCOPED_TRACE(name);
    const fs::path src = test::data_path(name);
    const GgufFile f = GgufFile::open(src);
    GgufWriter w(dir / "copy.gguf", f.alignment());
    for (const auto& [key, value] : f.metadata()) w.set(key, value);
    for (const GgufTensorInfo& t : f.tensors()) {
      w.add_tensor_data(t.name, t.dtype,
                        std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim),
                        f.data() + t.offset);
    }
    w.write();
    EXPECT_TRUE(read_bytes(dir / "copy.gguf") == read_bytes(src));
  }
}

// --- split GGUF (llama.cpp's gguf-split) ---

// Expects GgufFile::open(path) to throw Error of `kind` whose message contains every needle.
void expect_open_error(const fs::path& path, ErrorKind kind,
                       std::initializer_list<std::string> needles) {
  try {
    GgufFile::open(path);
    ADD_FAILURE() << "open succeeded, expected an error containing " << *needles.begin();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    const std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

// A real llama.cpp file written as three shards reads as the original: every tensor's bytes, shape
// and type, every metadata value, views into the shard that holds each tensor.
TEST(GgufSplit, ShardsReadAsTheWholeFile) {
  test::TempDir dir("split");
  const GgufFile src = GgufFile::open(test::data_path("golden/deepseek3-q4_k_m.gguf"));
  const fs::path first = test::write_split_gguf(src, dir.path(), "ds3", 3);
  EXPECT_EQ(first.filename(), "ds3-00001-of-00003.gguf");
  const GgufFile f = GgufFile::open(first);
  ASSERT_EQ(f.tensors().size(), src.tensors().size());
  std::set<uint32_t> shards;
  for (size_t i = 0; i < src.tensors().size(); ++i) {
    const GgufTensorInfo& want = src.tensors()[i];
    SCOPED_TRACE(want.name);
    EXPECT_EQ(f.tensors()[i].name, want.name) << "file order, shard after shard";
    const GgufTensorInfo* got = f.find_tensor(want.name);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->dtype, want.dtype);
    EXPECT_EQ(got->ndim, want.ndim);
    EXPECT_EQ(got->shape, want.shape);
    ASSERT_EQ(got->nbytes, want.nbytes);
    EXPECT_EQ(0, std::memcmp(f.tensor_data(*got), src.tensor_data(want), want.nbytes));
    EXPECT_EQ(f.tensor(want.name).data, f.tensor_data(*got));
    // (write_split_gguf's shard k holds tensors [n * k / 3, n * (k + 1) / 3))
    const size_t n = src.tensors().size();
    const uint32_t shard = i < n / 3 ? 0 : i < n * 2 / 3 ? 1 : 2;
    EXPECT_EQ(got->shard, shard);
    shards.insert(got->shard);
  }
  EXPECT_EQ(shards.size(), 3u);
  for (const auto& [key, value] : src.metadata()) {
    const GgufValue* v = f.find(key);
    ASSERT_NE(v, nullptr) << key;
    EXPECT_TRUE(*v == value) << key;
  }
  const std::vector<fs::path> paths = f.shard_paths();
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(paths[2], dir / "ds3-00003-of-00003.gguf");
  EXPECT_EQ(f.path_of(src.tensors().back().name), (dir / "ds3-00003-of-00003.gguf").string());
}

// A later shard, a missing one, a renamed first shard, shards swapped, a tensor in two shards and
// a tensor count that does not add up: each an error naming the files.
TEST(GgufSplit, BadSplitsAreErrorsNamingTheShards) {
  const GgufFile src = GgufFile::open(test::data_path("golden/deepseek3-q4_k_m.gguf"));
  {
    test::TempDir dir("split");
    test::write_split_gguf(src, dir.path(), "m", 3);
    expect_open_error(dir / "m-00002-of-00003.gguf", ErrorKind::kInvalidArgument,
                      {"shard 2 of 3", "pass the first", "m-00001-of-00003.gguf"});
    fs::copy_file(dir / "m-00001-of-00003.gguf", dir / "renamed.gguf");
    expect_open_error(dir / "renamed.gguf", ErrorKind::kFormat,
                      {"renamed.gguf", "cannot be found"});
    fs::rename(dir / "m-00002-of-00003.gguf", dir / "tmp.gguf");
    fs::rename(dir / "m-00003-of-00003.gguf", dir / "m-00002-of-00003.gguf");
    expect_open_error(dir / "m-00001-of-00003.gguf", ErrorKind::kFormat,
                      {"m-00002-of-00003.gguf", "expected shard 2 of 3", "found split.no 2"});
    fs::remove(dir / "m-00002-of-00003.gguf");
    expect_open_error(dir / "m-00001-of-00003.gguf", ErrorKind::kIo,
                      {"missing", "m-00002-of-00003.gguf"});
  }
  // Rewrites shard `no` (0-based) of a 2-file split with `extra` of the first shard's tensors
  // added (duplicates) or with its tensors dropped.
  auto rewrite = [&](const fs::path& p, int no, const GgufFile& donor, size_t extra, bool drop) {
    const std::vector<uint8_t> bytes = read_bytes(p.parent_path() / "orig.gguf");
    const GgufFile old = GgufFile::parse("orig.gguf", bytes.data(), bytes.size());
    GgufWriter w(p, old.alignment());
    for (const auto& [key, value] : old.metadata()) w.set(key, value);
    EXPECT_EQ(old.get_int("split.no", -1), no);
    std::vector<std::vector<uint8_t>> keep;
    auto add = [&](const GgufFile& f, const GgufTensorInfo& t) {
      keep.emplace_back(f.tensor_data(t), f.tensor_data(t) + t.nbytes);
      w.add_tensor_data(t.name, t.dtype,
                        std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim),
                        keep.back().data());
    };
    keep.reserve(old.tensors().size() + extra);
    if (!drop) {
      for (const GgufTensorInfo& t : old.tensors()) add(old, t);
    }
    for (size_t i = 0; i < extra; ++i) add(donor, donor.tensors()[i]);
    w.write();
  };
  {
    test::TempDir dir("split");
    const fs::path first = test::write_split_gguf(src, dir.path(), "x", 2);
    const fs::path second = dir / "x-00002-of-00002.gguf";
    fs::copy_file(second, dir / "orig.gguf");
    rewrite(second, 1, src, 1, false);
    expect_open_error(first, ErrorKind::kFormat,
                      {"x-00002-of-00002.gguf", src.tensors()[0].name, "in two shards"});
    rewrite(second, 1, src, 0, true);
    expect_open_error(first, ErrorKind::kFormat,
                      {"x-00001-of-00002.gguf", "split.tensors.count is"});
  }
}

}  // namespace
}  // namespace tandem
