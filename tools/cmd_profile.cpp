// `tandem profile`: measure the cost model (CPU expert time vs tokens, accelerator expert time,
// link transfer per expert) on this machine and save it for the policies and `tandem sim`.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/weights.h"
#include "runtime/profile.h"
#include "tools/command.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

struct ProfileArgs {
  std::string model, out = "profile.json";
  int threads = 0;
  rt::ProfileOptions o;
};

void run_profile(const ProfileArgs& a) {
  rt::ProfileOptions o = a.o;
  o.backend = resolve_backend_options(a.o.backend, a.model);
  const LoadedModel lm = load_model(a.model, load_mode(o.backend));
  page_in_model(lm);
  ThreadingContext threading(ThreadingOptions{a.threads, true, 50});
  o.accel = a.o.backend.accel == "auto" ? "none" : a.o.backend.accel;
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
}

void add_profile(CLI::App& app) {
  auto a = std::make_shared<ProfileArgs>();
  app.add_option("-m,--model", a->model, "a .gguf file or an HF directory")->required();
  app.add_option("-o,--output", a->out, "cost model JSON to write")->capture_default_str();
  app.add_option("--repeats", a->o.repeats, "runs per point (best of)")->capture_default_str();
  app.add_option("--tokens", a->o.tokens, "token counts to measure")->delimiter(',');
  app.add_option("--trace", a->o.trace,
                 "routing trace (`tandem trace`): per-layer expert popularity for --gpu-experts");
  add_threads_option(app, &a->threads);
  add_backend_options(app, &a->o.backend);
  app.callback([a] { run_profile(*a); });
}

Registrar reg("profile",
              "Measure expert compute and transfer costs for the policies and `tandem sim`",
              add_profile);

}  // namespace
}  // namespace tandem::tools
