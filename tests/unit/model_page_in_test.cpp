// page_in_model reads every tensor's bytes once (GGUF and HF), and reports how many.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tandem
