// Tokenizer throughput: encoding ~1 MB of mixed text (English prose, code, numbers, some CJK and
// accented words) with the real vocabularies. Reports bytes/s; the target is well under a second
// per megabyte.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <string>

#include "engine/tokenizer.h"

namespace tandem {
namespace {

std::string megabyte_of_text() {
  const std::string chunk =
      "The quick brown fox jumps over the lazy dog. It's 2024, and we've got 1,234.56 reasons "
      "to tokenize fast!\n    for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n"
      "Über naïve café: déjà vu. 日本語のテキストと中文文本。 Привет, мир! \t  \n\n";
  std::string s;
  while (s.size() < (1u << 20)) s += chunk;
  return s;
}

void encode_megabyte(benchmark::State& state, const char* vocab) {
  // CMake compiles with absolute paths: the vocabularies are beside this file's folder.
  const auto dir = std::filesystem::path(__FILE__).parent_path().parent_path() / "tests/data/vocab";
  const Tokenizer tok = Tokenizer::from_gguf_file(dir / vocab);
  const std::string text = megabyte_of_text();
  size_t tokens = 0;
  for (auto _ : state) {
    std::vector<TokenId> ids = tok.encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
  state.counters["tokens"] = double(tokens);
}

BENCHMARK_CAPTURE(encode_megabyte, gpt2, "ggml-vocab-gpt-2.gguf")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode_megabyte, deepseek_llm, "ggml-vocab-deepseek-llm.gguf")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode_megabyte, llama_spm, "ggml-vocab-llama-spm.gguf")
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
