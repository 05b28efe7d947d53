// safetensors reader/writer: exact bytes of a written file, round trips of every dtype, sharded
// checkpoints (>= 3 shards + HF index), the golden HF checkpoints, and every validation error.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/safetensors.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// A safetensors image from a header text and `data_bytes` bytes of data (value i = i & 0xff).
std::string image(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out += header;
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i & 0xff));
  return out;
}

void expect_error(const std::string& bytes, ErrorKind kind,
                  std::initializer_list<std::string> needles) {
  try {
    SafetensorsModel::parse("bad.safetensors", reinterpret_cast<const uint8_t*>(bytes.data()),
                            bytes.size());
    ADD_FAILURE() << "parse succeeded, expected an error containing " << *needles.begin();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

TEST(SafetensorsWriter, ExactBytes) {
  test::TempDir dir("st");
  SafetensorsWriter w(dir.path());
  w.set_metadata("format", "pt");
  // Added out of order: the file lists tensors by name, like safetensors-python.
  w.add_tensor("z", DType::kI32, {2}, [](void* d) {
    const int32_t v[2] = {-1, 7};
    std::memcpy(d, v, sizeof v);
  });
  w.add_tensor("a", DType::kBF16, {1, 2}, [](void* d) {
    const uint16_t v[2] = {0x3f80, 0xc000};  // 1.0, -2.0
    std::memcpy(d, v, sizeof v);
  });
  w.write();
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},)"
      R"("z":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})";
  while (header.size() % 8) header += ' ';
  std::string expected = image(header, 0);
  for (uint8_t c : {0x80, 0x3f, 0x00, 0xc0, 0xff, 0xff, 0xff, 0xff, 0x07, 0x00, 0x00, 0x00}) {
    expected.push_back(static_cast<char>(c));
  }
  EXPECT_EQ(read_text(dir / "model.safetensors"), expected);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));

  const SafetensorsModel m = SafetensorsModel::open(dir.path());
  EXPECT_EQ(m.metadata().at("format"), "pt");
  ASSERT_EQ(m.tensors().size(), 2u);
  EXPECT_EQ(m.tensors()[0].name, "a");
  const Tensor z = m.tensor("z");
  EXPECT_EQ(z.dtype, DType::kI32);
  EXPECT_EQ(z.as<int32_t>()[0], -1);
  EXPECT_EQ(z.as<int32_t>()[1], 7);
  const Tensor a = m.tensor("a");
  EXPECT_EQ(a.shape_string(), "[1, 2]");
  EXPECT_EQ(a.stride_bytes[0], 4);
  EXPECT_EQ(a.as<uint16_t>()[1], 0xc000);
  EXPECT_EQ(m.find_tensor("a")->file, (dir / "model.safetensors").string());
}

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

const std::vector<Spec> kSpecs = {
    {"bf16", DType::kBF16, {3, 4}},   {"f16", DType::kF16, {5}},
    {"f32", DType::kF32, {2, 2, 2}},  {"f64", DType::kF64, {3}},
    {"fp8", DType::kF8E4M3, {4, 8}},  {"i8", DType::kI8, {7}},
    {"u8", DType::kU8, {1, 1, 1, 3}}, {"i16", DType::kI16, {6}},
    {"i32", DType::kI32, {2, 5}},     {"i64", DType::kI64, {2}},
    {"scalar", DType::kF32, {}},      {"empty", DType::kF32, {0, 4}},
};

uint8_t pattern(const std::string& name, size_t i) {
  return static_cast<uint8_t>(i * 37 + name[0]);
}

void add_specs(SafetensorsWriter& w) {
  for (const Spec& s : kSpecs) {
    w.add_tensor(s.name, s.dtype, s.shape, [s](void* dst) {
      int64_t n = 1;
      for (int64_t d : s.shape) n *= d;
      auto* p = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < dtype_bytes(s.dtype, n); ++i) p[i] = pattern(s.name, i);
    });
  }
}

void check_specs(const SafetensorsModel& m) {
  ASSERT_EQ(m.tensors().size(), kSpecs.size());
  for (const Spec& s : kSpecs) {
    const SafetensorsTensorInfo* info = m.find_tensor(s.name);
    ASSERT_NE(info, nullptr) << s.name;
    EXPECT_EQ(info->dtype, s.dtype) << s.name;
    ASSERT_EQ(info->ndim, static_cast<int>(s.shape.size())) << s.name;
    int64_t n = 1;
    for (int d = 0; d < info->ndim; ++d) {
      EXPECT_EQ(info->shape[d], s.shape[d]);
      n *= s.shape[d];
    }
    ASSERT_EQ(info->nbytes, static_cast<uint64_t>(dtype_bytes(s.dtype, n))) << s.name;
    for (uint64_t i = 0; i < info->nbytes; ++i)
      ASSERT_EQ(info->data[i], pattern(s.name, i)) << s.name;
  }
}

TEST(SafetensorsWriter, RoundTripsEveryDtype) {
  test::TempDir dir("st");
  SafetensorsWriter w(dir.path());
  add_specs(w);
  w.write();
  const SafetensorsModel m = SafetensorsModel::open(dir / "model.safetensors");
  check_specs(m);
  EXPECT_TRUE(m.metadata().empty());
  EXPECT_EQ(m.tensor("scalar").ndim, 0);
  EXPECT_EQ(m.tensor("scalar").numel(), 1);
  EXPECT_EQ(m.tensor("empty").numel(), 0);
  // The header is padded to 8 bytes, so the data starts 8-aligned.
  const std::string bytes = read_text(dir / "model.safetensors");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
}

TEST(SafetensorsWriter, ShardsWithAnHfIndex) {
  test::TempDir dir("st");
  // Tensor sizes in name order: bf16 24, empty 0, f16 10, f32 32, f64 24, fp8 32, i16 12, i32 40,
  // i64 16, i8 7, scalar 4, u8 3  => greedy 40-byte shards.
  SafetensorsWriter w(dir.path(), 40);
  w.set_metadata("format", "pt");
  add_specs(w);
  w.write();
  const std::vector<std::vector<std::string>> expected = {
      {"bf16", "empty", "f16"},     {"f32"}, {"f64"}, {"fp8"}, {"i16"}, {"i32"},
      {"i64", "i8", "scalar", "u8"}};
  const size_t n = expected.size();
  const auto index = nlohmann::json::parse(read_text(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(),
            24u + 10 + 32 + 24 + 32 + 7 + 3 + 12 + 40 + 16 + 4);
  EXPECT_EQ(index["weight_map"].size(), kSpecs.size());
  for (size_t i = 0; i < n; ++i) {
    const std::string shard = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
    EXPECT_TRUE(fs::exists(dir / shard)) << shard;
    for (const std::string& t : expected[i]) EXPECT_EQ(index["weight_map"][t], shard) << t;
  }
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  EXPECT_EQ(read_text(dir / "model.safetensors.index.json").back(), '\n');

  for (const fs::path& p : {dir.path(), dir / "model.safetensors.index.json"}) {
    const SafetensorsModel m = SafetensorsModel::open(p);
    EXPECT_EQ(m.num_shards(), n);
    check_specs(m);
    EXPECT_EQ(m.metadata().at("format"), "pt");
    EXPECT_EQ(m.find_tensor("u8")->file,
              (dir / fmt::format("model-{:05d}-of-{:05d}.safetensors", n, n)).string());
  }
  // One shard opened alone holds just its tensors.
  EXPECT_EQ(SafetensorsModel::open(dir / "model-00001-of-00007.safetensors").tensors().size(), 3u);
}

TEST(SafetensorsModel, ShardErrors) {
  test::TempDir dir("st");
  SafetensorsWriter w(dir.path(), 40);
  add_specs(w);
  w.write();
  const fs::path index = dir / "model.safetensors.index.json";
  const std::string good = read_text(index);
  auto expect_open_error = [&](ErrorKind kind, std::initializer_list<std::string> needles) {
    try {
      SafetensorsModel::open(dir.path());
      ADD_FAILURE() << "open succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      for (const std::string& s : needles)
        EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
    }
  };
  // A shard named in the index that is missing.
  auto j = nlohmann::json::parse(good);
  j["weight_map"]["f32"] = "model-00009-of-00009.safetensors";
  write_text(index, j.dump());
  expect_open_error(ErrorKind::kIo, {"model-00009-of-00009.safetensors", "missing"});
  // A tensor in the index that its shard does not hold.
  j = nlohmann::json::parse(good);
  j["weight_map"]["f32"] = "model-00001-of-00007.safetensors";
  write_text(index, j.dump());
  expect_open_error(ErrorKind::kFormat,
                    {"'f32'", "model-00001-of-00007.safetensors", "does not hold"});
  j["weight_map"]["ghost"] = "model-00001-of-00007.safetensors";
  j["weight_map"]["f32"] = "model-00002-of-00007.safetensors";
  write_text(index, j.dump());
  expect_open_error(ErrorKind::kFormat, {"'ghost'"});
  // Shard names must stay inside the checkpoint directory.
  j = nlohmann::json::parse(good);
  j["weight_map"]["f32"] = "../model-00002-of-00007.safetensors";
  write_text(index, j.dump());
  expect_open_error(ErrorKind::kFormat, {"not a plain shard file name"});
  write_text(index, R"({"weight_map": {"a": 3}})");
  expect_open_error(ErrorKind::kFormat, {"weight_map['a']"});
  write_text(index, R"({"metadata": {}})");
  expect_open_error(ErrorKind::kFormat, {"weight_map"});
  write_text(index, "{\"weight_map\": ");
  expect_open_error(ErrorKind::kFormat, {"model.safetensors.index.json", "invalid JSON"});
  fs::remove(index);
  expect_open_error(ErrorKind::kIo, {"neither"});
}

TEST(SafetensorsModel, HeaderErrors) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NO_THROW(SafetensorsModel::parse(
      "x", reinterpret_cast<const uint8_t*>(image(ok, 8).data()), image(ok, 8).size()));
  expect_error("1234567", ErrorKind::kFormat, {"truncated"});
  std::string b = image(ok, 8);
  const uint64_t huge = 1ull << 40;
  std::memcpy(b.data(), &huge, 8);
  expect_error(b, ErrorKind::kFormat, {"header length", "exceeds"});
  expect_error(image(R"({"a":)", 0), ErrorKind::kFormat, {"invalid JSON"});
  expect_error(image("[1,2]", 0), ErrorKind::kFormat, {"not a JSON object"});
  const std::string a8 = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  expect_error(image("{" + a8 + "," + a8 + "}", 8), ErrorKind::kFormat, {"duplicate key 'a'"});
  expect_error(image(R"({"a":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[0,2]}})", 2),
               ErrorKind::kUnsupported, {"tensor 'a'", "F8_E5M2"});
  expect_error(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4),
               ErrorKind::kFormat, {"tensor 'a'", "out of bounds"});
  expect_error(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
               ErrorKind::kFormat, {"tensor 'a'", "out of bounds"});
  expect_error(image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 12),
               ErrorKind::kFormat, {"tensor 'a'", "needs 12"});
  const std::string b412 = R"("b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]})";
  expect_error(image("{" + a8 + "," + b412 + "}", 12), ErrorKind::kFormat, {"'a' and 'b' overlap"});
  expect_error(image(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
               ErrorKind::kFormat, {"tensor 'a'", "non-negative"});
  expect_error(image(R"({"a":{"dtype":"F32","shape":[1,1,1,1,2],"data_offsets":[0,8]}})", 8),
               ErrorKind::kUnsupported, {"tensor 'a'", "5 dimensions"});
  expect_error(
      image(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
      ErrorKind::kFormat, {"tensor 'a'", "overflow"});
  expect_error(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
               ErrorKind::kFormat, {"tensor 'a'", "data_offsets"});
  expect_error(image(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8), ErrorKind::kFormat,
               {"tensor 'a'", "dtype"});
  expect_error(image(R"({"a":[1]})", 8), ErrorKind::kFormat, {"tensor 'a'"});
  expect_error(image(R"({"__metadata__":{"k":1}})", 0), ErrorKind::kFormat,
               {"__metadata__", "'k'"});
  expect_error(image(std::string(20, '[') + std::string(20, ']'), 0), ErrorKind::kFormat,
               {"nested"});
}

// The format's rule that the tensors fill the data section, no holes and nothing after: a header
// length one byte short (the data read shifted into the JSON's padding) must not parse into
// garbage.
TEST(SafetensorsModel, TensorsMustFillTheDataSection) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string shifted = image(ok + "   ", 8);
  const uint64_t short_by_one = ok.size() + 2;
  std::memcpy(shifted.data(), &short_by_one, 8);
  expect_error(shifted, ErrorKind::kFormat, {"fill 8 bytes of the 9-byte data section"});
  expect_error(image(ok, 12), ErrorKind::kFormat, {"fill 8 bytes of the 12-byte data section"});
  const std::string b812 = R"("b":{"dtype":"I32","shape":[1],"data_offsets":[12,16]})";
  expect_error(image("{" + std::string(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})") +
                         "," + b812 + "}",
                     16),
               ErrorKind::kFormat, {"tensor 'b'", "begin at 12", "ends at 8"});
}

TEST(SafetensorsWriter, RejectsBadTensors) {
  test::TempDir dir("st");
  SafetensorsWriter w(dir.path());
  w.add_tensor("a", DType::kF32, {2}, nullptr);
  EXPECT_THROW(w.add_tensor("a", DType::kF32, {2}, nullptr), Error);
  EXPECT_THROW(w.add_tensor("b", DType::kF32, {-1}, nullptr), Error);
  EXPECT_THROW(w.add_tensor("b", DType::kF32, {1, 1, 1, 1, 1}, nullptr), Error);
  EXPECT_THROW(w.add_tensor("__metadata__", DType::kF32, {1}, nullptr), Error);
  try {
    w.add_tensor("q", DType::kQ8_0, {32}, nullptr);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("'q'"), std::string::npos);
  }
  EXPECT_THROW(SafetensorsWriter(dir.path(), 0), Error);
  SafetensorsWriter latin1(dir / "latin1");
  latin1.add_tensor("caf\xe9", DType::kF32, {1}, nullptr);  // not UTF-8: JSON cannot hold it
  try {
    latin1.write();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "latin1" / "model.safetensors"));
}

TEST(SafetensorsGolden, HfCheckpoints) {
  for (const char* model : {"deepseek2", "deepseek3", "mixtral", "qwen2moe", "qwen3moe"}) {
    SCOPED_TRACE(model);
    const SafetensorsModel m = SafetensorsModel::open(
        test::data_path(std::string("golden/") + model + "-hf/model.safetensors"));
    const SafetensorsTensorInfo* e = m.find_tensor("model.embed_tokens.weight");
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->dtype, DType::kBF16);
    EXPECT_EQ(e->ndim, 2);
    EXPECT_EQ(e->shape[0], 512);
    EXPECT_EQ(e->shape[1], 256);
    EXPECT_EQ(e->nbytes, 512u * 256 * 2);
    ASSERT_NE(m.find_tensor("lm_head.weight"), nullptr);
    EXPECT_EQ(m.tensor("model.norm.weight").shape_string(), "[256]");
    for (const SafetensorsTensorInfo& t : m.tensors()) EXPECT_EQ(t.dtype, DType::kBF16) << t.name;
  }
  const SafetensorsModel mix = SafetensorsModel::open(test::data_path("golden/mixtral-hf"));
  EXPECT_EQ(mix.tensor("model.layers.1.block_sparse_moe.experts.7.w1.weight").shape_string(),
            "[128, 256]");
  EXPECT_EQ(mix.tensor("model.layers.0.block_sparse_moe.gate.weight").shape_string(), "[8, 256]");
  const SafetensorsModel ds = SafetensorsModel::open(test::data_path("golden/deepseek3-hf"));
  EXPECT_EQ(ds.tensor("model.layers.1.mlp.experts.15.down_proj.weight").shape_string(),
            "[256, 64]");
}

// Writing a golden checkpoint again with SafetensorsWriter gives the same tensors and bytes.
TEST(SafetensorsGolden, RewriteRoundTrip) {
  test::TempDir dir("st");
  const SafetensorsModel src = SafetensorsModel::open(test::data_path("golden/qwen3moe-hf"));
  SafetensorsWriter w(dir.path(), 1 << 20);  // ~3.6 MB of weights: 4 shards
  for (const SafetensorsTensorInfo& t : src.tensors()) {
    w.add_tensor(t.name, t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim),
                 [&t](void* dst) { std::memcpy(dst, t.data, t.nbytes); });
  }
  w.write();
  const SafetensorsModel copy = SafetensorsModel::open(dir.path());
  EXPECT_GE(copy.num_shards(), 3u);
  ASSERT_EQ(copy.tensors().size(), src.tensors().size());
  for (const SafetensorsTensorInfo& t : src.tensors()) {
    const SafetensorsTensorInfo* c = copy.find_tensor(t.name);
    ASSERT_NE(c, nullptr) << t.name;
    EXPECT_EQ(c->shape, t.shape);
    ASSERT_EQ(c->nbytes, t.nbytes);
    EXPECT_EQ(std::memcmp(c->data, t.data, t.nbytes), 0) << t.name;
  }
}

}  // namespace
}  // namespace tandem
