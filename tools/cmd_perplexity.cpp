// `tandem perplexity`: perplexity of a text file as llama.cpp's llama-perplexity computes it. The
// text is tokenized (with BOS as the vocabulary asks) and cut into chunks of --ctx tokens; each
// chunk is evaluated from an empty cache with its first token replaced by BOS, and only the
// second half of each chunk is scored (every scored token has at least ctx/2 tokens of context).
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/input_file.h"
#include "core/thread_pool.h"
#include "engine/tokenizer.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "model/weights.h"
#include "tools/command.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

struct PerplexityArgs {
  std::string model;
  std::string file;
  int64_t ctx = 512;
  int threads = 0;
  BackendOptions backend;
  std::string cache_type = "f32";
};

void run_perplexity(const PerplexityArgs& a) {
  if (a.ctx < 4) fail(ErrorKind::kInvalidArgument, "--ctx must be at least 4, got {}", a.ctx);
  const KvType kv_type = parse_kv_type(a.cache_type);
  const std::string text = read_input_file(a.file, kMaxTextFileBytes, "-f");
  const BackendOptions backend = resolve_backend_options(a.backend, a.model);
  const LoadedModel lm = load_model(a.model, load_mode(backend));
  page_in_model(lm);
  const Tokenizer tok = lm.gguf ? Tokenizer::from_gguf(*lm.gguf) : Tokenizer::load(a.model);
  const std::vector<TokenId> tokens = tok.encode(text, /*add_special=*/true);
  const int64_t n_ctx = a.ctx;
  if (static_cast<int64_t>(tokens.size()) < 2 * n_ctx) {
    fail(ErrorKind::kInvalidArgument,
         "{}: {} tokens, perplexity with --ctx {} needs at least {} (2 x ctx)", a.file,
         tokens.size(), n_ctx, 2 * n_ctx);
  }
  const int64_t n_chunks = static_cast<int64_t>(tokens.size()) / n_ctx;
  const int64_t nv = lm.config.vocab_size;
  ThreadingContext threading(ThreadingOptions{a.threads, true, 50});
  ModelOptions mo;
  mo.ctx = n_ctx;
  mo.pool = &threading.pool();
  mo.kv_type = kv_type;
  MoeRuntime moe(lm, backend, threading);
  mo.moe = moe.backend();
  mo.views = moe.weight_views();
  Model model(lm, mo);
  std::fprintf(stderr, "%s\n%s\n%zu tokens, %ld chunks of %ld\n", model_summary(lm).c_str(),
               moe.summary().c_str(), tokens.size(), static_cast<long>(n_chunks), static_cast<long>(n_ctx));
  std::vector<float> logits(static_cast<size_t>(n_ctx * nv));
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  const int64_t first = n_ctx / 2;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < n_chunks; ++c) {
    std::copy(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx, chunk.begin());
    if (tok.add_bos() && tok.bos_id() >= 0) chunk[0] = tok.bos_id();
    model.reset();
    model.forward(chunk, logits.data(), true);
    for (int64_t j = first; j < n_ctx - 1; ++j) {
      const float* row = logits.data() + j * nv;
      float mx = row[0];
      for (int64_t v = 1; v < nv; ++v) mx = std::max(mx, row[v]);
      double sum = 0;
      for (int64_t v = 0; v < nv; ++v) sum += std::exp(double(row[v]) - mx);
      const double lp = double(row[tokens[c * n_ctx + j + 1]]) - mx - std::log(sum);
      nll -= lp;
      nll2 += lp * lp;
      ++count;
    }
    std::printf("[%ld]%.4f,", static_cast<long>(c + 1), std::exp(nll / count));
    std::fflush(stdout);
  }
  const double mean = nll / count;
  const double var = nll2 / count - mean * mean;
  const double err = count > 1 ? std::sqrt(std::max(var, 0.0) / (count - 1)) : 0.0;
  const double ppl = std::exp(mean);
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl, ppl * err);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "%ld tokens evaluated in %.2f s (%.1f tokens/s)\n",
               static_cast<long>(n_chunks * n_ctx), s, n_chunks * n_ctx / std::max(s, 1e-9));
}

void add_perplexity(CLI::App& app) {
  auto args = std::make_shared<PerplexityArgs>();
  app.add_option("-m,--model", args->model, "a .gguf file or an HF directory with its tokenizer")->required();
  app.add_option("-f,--file", args->file, "the text file")->required();
  app.add_option("--ctx", args->ctx, "tokens per chunk (default 512)");
  add_threads_option(app, &args->threads);
  add_backend_options(app, &args->backend);
  add_cache_type_option(app, &args->cache_type);
  app.callback([args] { run_perplexity(*args); });
}

Registrar reg("perplexity", "Perplexity of a text file, computed as llama-perplexity does",
              add_perplexity);

}  // namespace
}  // namespace tandem::tools
