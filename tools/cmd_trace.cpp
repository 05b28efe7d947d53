// `tandem trace`: record a routing trace from a model run over a text (prefill chunks, optional
// greedy decode steps after each), synthesize one (--synthetic), or convert the demo's
// numpy-style traces (--import). The format is docs/traces.md; `tandem sim` replays it.
#include <fmt/format.h>

#include <algorithm>
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
#include "engine/tokenizer.h"
#include "model/model.h"
#include "model/weights.h"
#include "runtime/calibrate.h"
#include "runtime/trace.h"
#include "runtime/trace_record.h"
#include "runtime/trace_synth.h"
#include "tools/command.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

struct TraceArgs {
  std::string model, file, out, import;
  int64_t ctx = 256;
  int decode = 0;
  int chunks = 0;
  int threads = 0;
  bool scores = false, f16 = false, synthetic = false;
  rt::SynthTraceOptions synth;
  BackendOptions backend;
};

void print_summary(const rt::Trace& t, const std::string& out) {
  const auto batches = rt::trace_batches(t);
  int64_t decode = 0;
  for (uint8_t p : t.phase) decode += p;
  // Popularity skew: the share of selections that went to the top quarter of experts.
  const auto counts = rt::expert_counts(t);
  double top_share = 0;
  for (auto c : counts) {
    std::sort(c.begin(), c.end(), std::greater<>());
    int64_t top = 0, all = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      all += c[i];
      if (i < (c.size() + 3) / 4) top += c[i];
    }
    top_share += all ? double(top) / all : 0;
  }
  std::printf(
      "%s: %ld records (%ld prefill, %ld decode) in %zu batches; %d MoE layers, %d experts, "
      "top-%d; top 25%% experts take %.1f%% of selections%s%s%s\n",
      out.c_str(), long(t.size()), long(t.size() - decode), long(decode), batches.size(),
      t.n_layers, t.n_experts, t.top_k, 100.0 * top_share / t.n_layers,
      t.has_scores ? "; scores" : "", t.has_gate_pred ? "; gate predictions" : "",
      t.has_residual_pred ? "; residual predictions" : "");
  if (t.has_gate_pred || t.has_residual_pred) {
    std::printf("next-layer top-%d recall: gate %.1f%%, residual %s\n", t.top_k,
                100 * rt::prediction_recall(t, false),
                t.has_residual_pred
                    ? fmt::format("{:.1f}%", 100 * rt::prediction_recall(t, true)).c_str()
                    : "-");
  }
}

void record_from_model(const TraceArgs& a, rt::Trace* out) {
  if (a.model.empty() || a.file.empty()) {
    fail(ErrorKind::kInvalidArgument,
         "trace: -m MODEL and -f TEXT are required (or --synthetic / --import)");
  }
  if (a.decode < 0) fail(ErrorKind::kInvalidArgument, "--decode must be >= 0, got {}", a.decode);
  if (a.ctx - a.decode < 2) {
    fail(ErrorKind::kInvalidArgument, "--ctx {} leaves no room for a prompt before {} decode steps",
         a.ctx, a.decode);
  }
  const std::string text = read_input_file(a.file, kMaxTextFileBytes, "-f");
  std::unique_ptr<rt::TraceRecorder> rec;  // (made once the weights are loaded)
  EngineOptions eo;
  eo.model = a.model;
  eo.threads = a.threads;
  eo.backend = a.backend;
  eo.page_in = false;
  eo.on_routing = [&rec](const RoutingEvent& e) { rec->on_routing(e); };
  Engine engine(eo);
  const LoadedModel& lm = engine.weights();
  const Tokenizer& tok = engine.tokenizer();
  const std::vector<TokenId> tokens = tok.encode(text, /*add_special=*/true);
  const int64_t len = a.ctx - a.decode;
  int64_t n_chunks = std::max<int64_t>(1, (int64_t(tokens.size()) + len - 1) / len);
  if (a.chunks > 0) n_chunks = std::min<int64_t>(n_chunks, a.chunks);
  if (tokens.empty()) fail(ErrorKind::kInvalidArgument, "{}: no tokens", a.file);
  std::unique_ptr<rt::ResidualVectors> res;
  // --residuals (a backend option: the runtime's residual prefetcher reads it too) adds residual
  // predictions to the trace.
  if (!a.backend.residuals.empty()) {
    res = std::make_unique<rt::ResidualVectors>(rt::ResidualVectors::load(a.backend.residuals));
  }
  rec = std::make_unique<rt::TraceRecorder>(
      lm, rt::TraceRecordOptions{a.scores, a.scores || res != nullptr, res.get()});
  SingleSequence model(engine.model(), a.ctx);
  const int64_t nv = lm.config.vocab_size;
  std::vector<float> logits(static_cast<size_t>(nv));
  for (int64_t c = 0; c < n_chunks; ++c) {
    const auto b = tokens.begin() + std::min<int64_t>(c * len, int64_t(tokens.size()));
    const auto e = tokens.begin() + std::min<int64_t>((c + 1) * len, int64_t(tokens.size()));
    if (b == e) break;
    std::vector<int32_t> chunk(b, e);
    model.reset();
    rec->begin_batch(rt::TracePhase::kPrefill);
    model.forward(chunk, logits.data(), false);
    for (int d = 0; d < a.decode; ++d) {
      const int32_t next = argmax_token(logits.data(), int64_t(logits.size()));
      rec->begin_batch(rt::TracePhase::kDecode);
      model.forward(std::span<const int32_t>(&next, 1), logits.data(), false);
    }
  }
  *out = std::move(rec->trace());
}

void run_trace(const TraceArgs& a) {
  if (a.out.empty()) fail(ErrorKind::kInvalidArgument, "trace: -o FILE is required");
  rt::Trace t;
  if (a.synthetic) {
    t = rt::synth_trace(a.synth);
  } else if (!a.import.empty()) {
    t = rt::read_trace(a.import);  // a demo NAME.json pair or a tandem trace (re-written)
  } else {
    record_from_model(a, &t);
  }
  rt::write_trace(t, a.out, {a.f16});
  print_summary(t, a.out);
}

void add_trace(CLI::App& app) {
  auto a = std::make_shared<TraceArgs>();
  app.add_option("-m,--model", a->model, "a .gguf file or an HF directory");
  app.add_option("-f,--file", a->file, "the text to run the model over");
  app.add_option("-o,--output", a->out, "the trace file to write")->required();
  app.add_option("--ctx", a->ctx,
                 "context per chunk: the text is cut into chunks of ctx - decode tokens")
      ->capture_default_str();
  app.add_option("--decode", a->decode, "greedy decode steps after each chunk")
      ->capture_default_str();
  app.add_option("--chunks", a->chunks, "at most this many chunks (0: the whole text)")
      ->capture_default_str();
  app.add_flag("--scores", a->scores,
               "record full router scores and gate-predicted next-layer scores");
  app.add_flag("--f16", a->f16, "store weights and scores as f16");
  add_threads_option(app, &a->threads);
  app.add_option("--import", a->import,
                 "convert a demo trace (NAME.json + NAME.bin) or re-write / summarize a trace");
  auto& s = a->synth;
  app.add_flag("--synthetic", a->synthetic,
               "generate a synthetic trace instead of running a model");
  app.add_option("--layers", s.n_layers, "synthetic: MoE layers")->capture_default_str();
  app.add_option("--experts", s.n_experts, "synthetic: routed experts per layer")
      ->capture_default_str();
  app.add_option("--top-k", s.top_k, "synthetic: experts per token")->capture_default_str();
  app.add_option("--skew", s.skew, "synthetic: Zipf exponent of expert popularity (0 = uniform)")
      ->capture_default_str();
  app.add_option("--locality", s.locality, "synthetic: P(reuse the previous token's expert)")
      ->capture_default_str();
  app.add_option("--correlation", s.correlation,
                 "synthetic: P(follow the previous layer's related expert)")
      ->capture_default_str();
  app.add_option("--prompts", s.prefill_batches, "synthetic: prompts (prefill batches)")
      ->capture_default_str();
  app.add_option("--prefill-tokens", s.prefill_tokens, "synthetic: tokens per prompt")
      ->capture_default_str();
  app.add_option("--decode-steps", s.decode_steps, "synthetic: decode steps per prompt")
      ->capture_default_str();
  app.add_option("--gate-noise", s.gate_noise, "synthetic: log-normal noise of gate predictions")
      ->capture_default_str();
  app.add_option("--residual-noise", s.residual_noise, "synthetic: noise of residual predictions")
      ->capture_default_str();
  app.add_option("--seed", s.seed, "synthetic: random seed")->capture_default_str();
  add_backend_options(app, &a->backend);
  app.callback([a] { run_trace(*a); });
}

Registrar reg("trace", "Record (or synthesize) an expert routing trace for `tandem sim`",
              add_trace);

}  // namespace
}  // namespace tandem::tools
