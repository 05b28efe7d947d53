// `tandem calibrate`: DALI's residual vectors (eq. 11) from a model run over a text, for the
// residual prefetcher (`--prefetch residual --residuals FILE`) and `tandem trace --residuals`.
#include <fmt/format.h>

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
#include "engine/tokenizer.h"
#include "model/model.h"
#include "model/weights.h"
#include "runtime/calibrate.h"
#include "engine/engine.h"
#include "tools/command.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

struct CalibrateArgs {
  std::string model, file, out;
  int64_t ctx = 256;
  int chunks = 0;
  int threads = 0;
  BackendOptions backend;
};

void run_calibrate(const CalibrateArgs& a) {
  if (a.ctx < 2) fail(ErrorKind::kInvalidArgument, "--ctx must be at least 2, got {}", a.ctx);
  const std::string text = read_input_file(a.file, kMaxTextFileBytes, "-f");
  std::unique_ptr<rt::ResidualCalibrator> cal;  // (made once the weights are loaded)
  EngineOptions eo;
  eo.model = a.model;
  eo.threads = a.threads;
  eo.backend = a.backend;
  eo.page_in = false;
  eo.on_routing = [&cal](const RoutingEvent& e) { cal->on_routing(e); };
  Engine engine(eo);
  const LoadedModel& lm = engine.weights();
  const std::vector<TokenId> tokens = engine.tokenizer().encode(text, true);
  if (tokens.empty()) fail(ErrorKind::kInvalidArgument, "{}: no tokens", a.file);
  cal = std::make_unique<rt::ResidualCalibrator>(lm);
  SingleSequence model(engine.model(), a.ctx);
  std::vector<float> logits(static_cast<size_t>(lm.config.vocab_size));
  int64_t done = 0;
  for (size_t b = 0; b < tokens.size(); b += size_t(a.ctx)) {
    if (a.chunks > 0 && done == a.chunks) break;
    const size_t e = std::min(tokens.size(), b + size_t(a.ctx));
    std::vector<int32_t> chunk(tokens.begin() + long(b), tokens.begin() + long(e));
    model.reset();
    model.forward(chunk, logits.data(), false);
    ++done;
  }
  const rt::ResidualVectors r = cal->result();
  r.save(a.out);
  double norm = 0;
  for (const auto& v : r.vectors) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    norm += std::sqrt(s);
  }
  std::printf(
      "%s: %zu residual vectors of %ld values from %ld tokens (%ld chunks); mean |r| %.4f\n",
      a.out.c_str(), r.vectors.size(), long(r.hidden_size), long(r.tokens), long(done),
      r.vectors.empty() ? 0.0 : norm / r.vectors.size());
}

void add_calibrate(CLI::App& app) {
  auto a = std::make_shared<CalibrateArgs>();
  app.add_option("-m,--model", a->model, "a .gguf file or an HF directory")->required();
  app.add_option("-f,--file", a->file, "calibration text")->required();
  app.add_option("-o,--output", a->out, "residual vectors (JSON) to write")->required();
  app.add_option("--ctx", a->ctx, "tokens per chunk")->capture_default_str();
  app.add_option("--chunks", a->chunks, "at most this many chunks (0: the whole text)")
      ->capture_default_str();
  add_threads_option(app, &a->threads);
  add_backend_options(app, &a->backend);
  app.callback([a] { run_calibrate(*a); });
}

Registrar reg("calibrate", "DALI residual vectors (eq. 11) for residual-based expert prefetching",
              add_calibrate);

}  // namespace
}  // namespace tandem::tools
