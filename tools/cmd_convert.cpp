// `tandem convert -m MODEL --cpu-experts int4|int8|bf16 [--expert-group G] [-o FILE]`: repacks
// the routed experts ahead of time into the cache file that `--cpu-experts` loads map
// (moe/cpu_experts.h), and prints where it is. A valid cache already there is left as it is.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "formats/output_file.h"
#include "moe/cpu_experts.h"
#include "model/weights.h"
#include "tools/command.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

struct ConvertArgs {
  std::string model;
  std::string format;
  int group = 128;
  std::string output;
  std::string cache_dir;
  int threads = 0;
};

void convert(const ConvertArgs& a) {
  if (a.format == "native" || a.format == "repack") {
    fail(ErrorKind::kInvalidArgument,
         "--cpu-experts {} uses the stored weights (repack rearranges them at load, in memory): "
         "there is nothing to convert", a.format);
  }
  if (a.format != "int8" && a.format != "int4" && a.format != "bf16") {
    fail(ErrorKind::kInvalidArgument, "--cpu-experts '{}': expected int8, int4 or bf16", a.format);
  }
  // -o naming a device or a FIFO is refused before the model is read (a symlink is written
  // through); a directory gets the cache's default name inside it.
  std::error_code ec;
  if (!a.output.empty() && !std::filesystem::is_directory(a.output, ec)) {
    (void)resolve_output_path(a.output);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const LoadedModel lm = load_model(a.model);
  CpuExpertOptions o;
  o.format = a.format;
  o.group = a.group;
  o.cache_dir = a.cache_dir;
  if (!a.output.empty()) {
    o.cache_file = a.output;
    if (std::filesystem::is_directory(a.output, ec)) {  // a directory: the default name in it
      o.cache_file.clear();
      o.cache_dir = a.output;
    }
  }
  ThreadingContext threading(ThreadingOptions{a.threads, true, 50});
  const CpuExperts experts = prepare_cpu_experts(lm, o, &threading.pool());
  if (experts.cache_path.empty()) {
    fail(ErrorKind::kIo, "{}: the repacked experts could not be written (see the log above)",
         cpu_expert_cache_path(lm, o).string());
  }
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{} {} experts ({}) in {}\n", experts.from_cache ? "up to date:" : "wrote",
             a.format, format_binary_bytes(experts.bytes), experts.cache_path.string());
  if (!experts.from_cache) fmt::print("packed in {:.2f} s\n", s);
}

void add_convert(CLI::App& app) {
  auto args = std::make_shared<ConvertArgs>();
  app.add_option("-m,--model", args->model, "a .gguf file or an HF checkpoint directory")
      ->required();
  app.add_option("--cpu-experts", args->format, "int8 | int4 | bf16")->required();
  app.add_option("--expert-group", args->group, "int8/int4 quantization group: 32, 64, 128")
      ->capture_default_str();
  app.add_option("-o,--output", args->output,
                 "cache file to write (a directory: the default file name in it; default: where "
                 "--cpu-experts loads look, next to the model)");
  app.add_option("--expert-cache-dir", args->cache_dir,
                 "directory of repacked expert caches (as for run / chat)");
  add_threads_option(app, &args->threads);
  app.callback([args] { convert(*args); });
}

Registrar reg("convert", "Repack the routed experts to int8 / int4 / bf16 (the load-time cache)",
              add_convert);

}  // namespace
}  // namespace tandem::tools
