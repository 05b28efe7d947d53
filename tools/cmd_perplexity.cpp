// `tandem perplexity`: perplexity of a text file as llama.cpp's llama-perplexity computes it. The
// text is tokenized (with BOS as the vocabulary asks) and cut into chunks of --ctx tokens; each
// chunk is evaluated from an empty cache with its first token replaced by BOS, and only the
// second half of each chunk is scored (every scored token has at least ctx/2 tokens of context).
// Chunks are independent sequences: -b / --ctx of them share each forward (the generator's batch).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/input_file.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/generator.h"
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
  int64_t batch = 2048;
  int threads = 0;
  BackendOptions backend;
  std::string cache_type = "f32";
};

void run_perplexity(const PerplexityArgs& a) {
  if (a.ctx < 4) fail(ErrorKind::kInvalidArgument, "--ctx must be at least 4, got {}", a.ctx);
  if (a.batch < 1) fail(ErrorKind::kInvalidArgument, "-b must be at least 1, got {}", a.batch);
  const KvType kv_type = parse_kv_type(a.cache_type);
  const std::string text = read_input_file(a.file, kMaxTextFileBytes, "-f");
  EngineOptions eo;
  eo.model = a.model;
  eo.threads = a.threads;
  eo.backend = a.backend;
  Engine engine(eo);
  const Tokenizer& tok = engine.tokenizer();
  const std::vector<TokenId> tokens = tok.encode(text, /*add_special=*/true);
  const int64_t n_ctx = a.ctx;
  if (static_cast<int64_t>(tokens.size()) < 2 * n_ctx) {
    fail(ErrorKind::kInvalidArgument,
         "{}: {} tokens, perplexity with --ctx {} needs at least {} (2 x ctx)", a.file,
         tokens.size(), n_ctx, 2 * n_ctx);
  }
  const int64_t n_chunks = static_cast<int64_t>(tokens.size()) / n_ctx;
  const int64_t nv = engine.config().vocab_size;
  // As llama-perplexity: -b tokens per forward, so b / ctx chunks (sequences) side by side.
  const int64_t parallel = std::clamp<int64_t>(a.batch / n_ctx, 1, n_chunks);
  KvCache cache = engine.make_cache(n_ctx, kv_type, parallel);
  GeneratorOptions go;
  go.max_batch_tokens = std::max(a.batch, n_ctx);
  go.reuse_prefix = false;
  Generator gen(engine.model(), cache, nullptr, go);
  std::fprintf(stderr, "%s\n%zu tokens, %ld chunks of %ld, %ld per forward\n",
               engine.summary().c_str(), tokens.size(), static_cast<long>(n_chunks),
               static_cast<long>(n_ctx), static_cast<long>(parallel));
  // Each chunk's second half scored: the log-probability of token j + 1 from position j's row.
  const int64_t first = n_ctx / 2;
  std::vector<double> nll(static_cast<size_t>(n_chunks)), nll2(nll.size());
  std::vector<int64_t> count(nll.size());
  const auto t0 = std::chrono::steady_clock::now();
  int64_t submitted = 0, done = 0;
  double sum = 0, sum2 = 0;
  int64_t total = 0;
  while (done < n_chunks) {
    while (submitted < n_chunks && gen.running() + gen.waiting() < parallel) {
      const int64_t c = submitted++;
      std::vector<int32_t> chunk(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx);
      if (tok.add_bos() && tok.bos_id() >= 0) chunk[0] = tok.bos_id();
      GenerateParams p;
      p.max_tokens = 0;
      p.on_prompt_logits = [&, c](int64_t pos, const float* rows, int64_t n) {
        for (int64_t j = std::max(pos, first); j < std::min(pos + n, n_ctx - 1); ++j) {
          const float* row = rows + (j - pos) * nv;
          float mx = row[0];
          for (int64_t v = 1; v < nv; ++v) mx = std::max(mx, row[v]);
          double z = 0;
          for (int64_t v = 0; v < nv; ++v) z += std::exp(double(row[v]) - mx);
          const double lp = double(row[tokens[c * n_ctx + j + 1]]) - mx - std::log(z);
          nll[static_cast<size_t>(c)] -= lp;
          nll2[static_cast<size_t>(c)] += lp * lp;
          ++count[static_cast<size_t>(c)];
        }
      };
      gen.submit(std::move(chunk), std::move(p));
    }
    for (const GenerateEvent& ev : gen.step()) {
      if (ev.finish == FinishReason::kError) fail(ErrorKind::kResource, "{}", ev.error);
    }
    // Chunks finish in order (equal lengths, submitted in order): report each as llama does.
    while (done < submitted && count[static_cast<size_t>(done)] == n_ctx - 1 - first) {
      sum += nll[static_cast<size_t>(done)];
      sum2 += nll2[static_cast<size_t>(done)];
      total += count[static_cast<size_t>(done)];
      ++done;
      std::printf("[%ld]%.4f,", static_cast<long>(done), std::exp(sum / total));
      std::fflush(stdout);
    }
  }
  const double mean = sum / total;
  const double var = sum2 / total - mean * mean;
  const double err = total > 1 ? std::sqrt(std::max(var, 0.0) / (total - 1)) : 0.0;
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
  app.add_option("-b,--batch", args->batch,
                 "tokens per forward: b / ctx chunks evaluated side by side (default 2048)");
  add_threads_option(app, &args->threads);
  add_backend_options(app, &args->backend);
  add_cache_type_option(app, &args->cache_type);
  app.callback([args] { run_perplexity(*args); });
}

Registrar reg("perplexity", "Perplexity of a text file, computed as llama-perplexity does",
              add_perplexity);

}  // namespace
}  // namespace tandem::tools
