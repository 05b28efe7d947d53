// page_in_model reads every tensor's bytes once (GGUF and HF), and reports how many; a model
// copied into memory at load (LoadMode::kCopy) holds the file's bytes and needs no paging in.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/memory.h"

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/weights.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

TEST(PageIn, GgufPagesInEveryTensor) {
  const LoadedModel lm = load_model(test::data_path("golden/deepseek3-q4_k_m.gguf"));
  uint64_t expected = 0;
  for (const GgufTensorInfo& t : lm.gguf->tensors()) expected += t.nbytes;
  ASSERT_GT(expected, 1u << 20);
  EXPECT_EQ(page_in_model(lm), expected);
}

TEST(PageIn, HfPagesInEveryShard) {
  const std::filesystem::path dir = test::data_path("golden/mixtral-hf");
  const LoadedModel lm = load_model(dir);
  const SafetensorsModel st = SafetensorsModel::open(dir);
  uint64_t expected = 0;
  for (const SafetensorsTensorInfo& t : st.tensors()) expected += t.nbytes;
  EXPECT_EQ(page_in_model(lm), expected);
}

std::vector<char> file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(LoadMode, CopyHoldsTheFilesBytes) {
  const std::filesystem::path gguf = test::data_path("golden/deepseek3-q4_k_m.gguf");
  const std::vector<char> want = file_bytes(gguf);
  const MappedFile mapped = MappedFile::open(gguf);
  const MappedFile copied = MappedFile::open(gguf, LoadMode::kCopy);
  EXPECT_FALSE(mapped.copied());
  // A few MiB always fit; with transparent huge pages off the file is mapped instead.
  const bool thp = thp_mode() != ThpMode::kNever;
  ASSERT_EQ(copied.copied(), thp);
  ASSERT_EQ(copied.size(), want.size());
  EXPECT_NE(copied.data(), mapped.data());
  EXPECT_EQ(0, std::memcmp(copied.data(), want.data(), want.size()));
  EXPECT_EQ(0, std::memcmp(mapped.data(), want.data(), want.size()));
  MappedFile moved = MappedFile::open(gguf, LoadMode::kCopy);
  const uint8_t* at = moved.data();
  MappedFile target = std::move(moved);  // the bytes stay where they are
  EXPECT_EQ(target.data(), at);
  EXPECT_EQ(target.copied(), thp);
  EXPECT_THROW(MappedFile::open(gguf.string() + ".missing", LoadMode::kCopy), Error);
}

// Resident pages of this process (/proc/self/statm, second field).
uint64_t resident_pages() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident;
}

TEST(LoadMode, ReleasedPagesLeaveTheResidentSetAndKeepTheBytes) {
  const std::filesystem::path gguf = test::data_path("golden/deepseek3-q4_k_m.gguf");
  const std::vector<char> want = file_bytes(gguf);
  const MappedFile mapped = MappedFile::open(gguf);
  const uint64_t pages = want.size() / 4096;
  ASSERT_GT(pages, 256u);
  const uint64_t before = resident_pages();
  ASSERT_EQ(0, std::memcmp(mapped.data(), want.data(), want.size()));  // touches every page
  const uint64_t touched = resident_pages();
  EXPECT_GE(touched, before + pages * 9 / 10);
  mapped.release_pages();
  EXPECT_LE(resident_pages(), touched - pages * 9 / 10);
  EXPECT_EQ(0, std::memcmp(mapped.data(), want.data(), want.size()));  // faulted back in
  // A copy is the only place its bytes are: released, they stay.
  const MappedFile copied = MappedFile::open(gguf, LoadMode::kCopy);
  copied.release_pages();
  EXPECT_EQ(0, std::memcmp(copied.data(), want.data(), want.size()));
  const LoadedModel lm = load_model(gguf, LoadMode::kCopy);
  release_model_pages(lm);
  EXPECT_EQ(0, std::memcmp(lm.gguf->data(), want.data(), want.size()));
}

TEST(LoadMode, CopiedModelsNeedNoPagingIn) {
  if (thp_mode() == ThpMode::kNever) {
    // Nothing is copied then: the models are mapped and paged in as without kCopy.
    const LoadedModel g =
        load_model(test::data_path("golden/deepseek3-q4_k_m.gguf"), LoadMode::kCopy);
    EXPECT_FALSE(g.gguf->in_memory());
    EXPECT_GT(page_in_model(g), 0u);
    return;
  }
  const LoadedModel g =
      load_model(test::data_path("golden/deepseek3-q4_k_m.gguf"), LoadMode::kCopy);
  ASSERT_TRUE(g.gguf->in_memory());
  EXPECT_EQ(page_in_model(g), 0u);
  const LoadedModel h = load_model(test::data_path("golden/mixtral-hf"), LoadMode::kCopy);
  ASSERT_TRUE(h.safetensors->in_memory());
  EXPECT_EQ(page_in_model(h), 0u);
  // The same tensors as the mapped model, byte for byte.
  const LoadedModel m = load_model(test::data_path("golden/deepseek3-q4_k_m.gguf"));
  ASSERT_EQ(g.gguf->tensors().size(), m.gguf->tensors().size());
  for (size_t i = 0; i < m.gguf->tensors().size(); ++i) {
    const GgufTensorInfo& t = m.gguf->tensors()[i];
    EXPECT_EQ(0, std::memcmp(g.gguf->data() + t.offset, m.gguf->data() + t.offset, t.nbytes));
  }
}

}  // namespace
}  // namespace tandem
