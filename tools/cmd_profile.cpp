// `tandem profile`: measure the cost model (CPU expert time vs tokens, accelerator expert time,
// link transfer per expert) on this machine and save it for the policies and `tandem sim`.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/weights.h"
#include "runtime/moe_runtime.h"
#include "runtime/profile.h"
#include "runtime/timeline.h"
#include "tools/command.h"
#include "tools/timeline_file.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

struct ProfileArgs {
  std::string model, out = "profile.json";
  int threads = 0;
  int timeline_tokens = 32;
  std::string timeline;  // --timeline FILE: the decode timeline's steps
  rt::ProfileOptions o;
};

// With an accelerator: `tokens` greedy decode steps through the runtime these flags build, and
// where their time went (rt::Timeline).
std::string decode_timeline(const LoadedModel& lm, const BackendOptions& backend,
                            ThreadingContext& threading, int tokens, const std::string& trace_to) {
  MoeRuntime moe(lm, backend, threading);
  ModelOptions mo;
  mo.forward.pool = &threading.pool();
  moe.apply(&mo);
  Model model(lm, mo);
  SingleSequence seq(model, tokens + 2);
  std::vector<float> logits(static_cast<size_t>(lm.config.vocab_size));
  int32_t t = 1;
  seq.forward(std::span<const int32_t>(&t, 1), logits.data(), false);  // (warm-up)
  moe.timeline()->take();
  TimelineFile timeline_file(trace_to);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < tokens; ++i) {
    t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    seq.forward(std::span<const int32_t>(&t, 1), logits.data(), false);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  timeline_file.finish();
  return fmt::format("decode timeline ({} tokens, {:.1f} tokens/s): {}", tokens, tokens / seconds,
                     rt::Timeline::format(moe.timeline()->take(), seconds, tokens));
}

void run_profile(const ProfileArgs& a) {
  if (!a.timeline.empty() && (a.o.backend.accel == rt::Accel::kAuto || a.o.backend.accel == rt::Accel::kNone ||
                              a.timeline_tokens == 0)) {
    fail(ErrorKind::kInvalidArgument,
         "--timeline: the decode timeline is taken with an accelerator (--accel) and "
         "--timeline-tokens > 0");
  }
  rt::ProfileOptions o = a.o;
  o.backend = resolve_backend_options(a.o.backend, a.model);
  const LoadedModel lm = load_model(a.model, load_mode(o.backend));
  page_in_model(lm);
  ThreadingContext threading(ThreadingOptions{a.threads, true, 50});
  o.accel = a.o.backend.accel == rt::Accel::kAuto ? rt::Accel::kNone : a.o.backend.accel;
  o.link = a.o.backend.link;
  const rt::ProfileResult r = rt::profile_experts(lm, o, threading);
  rt::save_profile(r, a.out);
  std::printf("%s\n%s: one expert = %.2f MB; transfer %.3f ms (%s)\n", r.cpu_backend.c_str(),
              r.model.c_str(), double(r.expert_bytes) / 1e6, 1e3 * r.transfer_seconds,
              r.transfer_source.c_str());
  std::printf("%8s %12s %14s %10s\n", "tokens", "cpu ms", "cpu us/token", "GB/s");
  for (const auto& p : r.cpu) {
    std::printf("%8ld %12.4f %14.2f %10.2f\n", long(p.tokens), 1e3 * p.seconds,
                1e6 * p.seconds / double(p.tokens), double(r.expert_bytes) / p.seconds / 1e9);
  }
  std::printf("wrote %s\n", a.out.c_str());
  if (o.accel != rt::Accel::kNone && a.timeline_tokens > 0) {
    BackendOptions b = o.backend;
    b.accel = o.accel;
    b.link = o.link;
    std::printf("%s\n", decode_timeline(lm, b, threading, a.timeline_tokens, a.timeline).c_str());
  }
}

void add_profile(CLI::App& app) {
  auto a = std::make_shared<ProfileArgs>();
  app.add_option("-m,--model", a->model, "a .gguf file or an HF directory")->required();
  app.add_option("-o,--output", a->out, "cost model JSON to write")->capture_default_str();
  app.add_option("--repeats", a->o.repeats, "runs per point (best of)")->capture_default_str();
  app.add_option("--tokens", a->o.tokens, "token counts to measure")->delimiter(',');
  app.add_option("--trace", a->o.trace,
                 "routing trace (`tandem trace`): per-layer expert popularity for --gpu-experts");
  app.add_option("--timeline-tokens", a->timeline_tokens,
                 "with --accel: greedy decode steps whose timeline is reported (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  add_timeline_option(app, &a->timeline, "the decode timeline's steps");
  add_threads_option(app, &a->threads);
  add_backend_options(app, &a->o.backend);
  app.callback([a] { run_profile(*a); });
}

Registrar reg("profile",
              "Measure expert compute and transfer costs for the policies and `tandem sim`",
              add_profile);

}  // namespace
}  // namespace tandem::tools
