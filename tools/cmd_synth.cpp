// `tandem synth`: writes a random-weight model of a supported architecture (a tiny one for tests,
// or a released model's shape, optionally truncated to a few layers for benchmarks) as GGUF or
// as an HF safetensors checkpoint. See formats/synth.h for what is written and why.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "formats/model_config.h"
#include "formats/synth.h"
#include "tools/command.h"

namespace tandem::tools {
namespace {

struct SynthArgs {
  std::string arch;
  std::string preset = "tiny";
  std::string format = "gguf";
  std::string type;
  uint64_t seed = 0;
  std::string vocab;
  int64_t layers = 0;
  CLI::Option* layers_option = nullptr;
  std::string output;
  std::string name;
  int threads = 0;
  uint64_t shard_bytes = 0;
  uint64_t assume_free_disk = 0;
  uint64_t assume_free_ram = 0;
};

ModelConfig resolve_config(const SynthArgs& a, std::string* preset_name) {
  std::string preset = a.preset;
  if (preset == "tiny") {
    if (a.arch.empty()) {
      fail(ErrorKind::kInvalidArgument, "--preset tiny needs --arch ({})",
           fmt::join(arch_names(), ", "));
    }
    preset = "tiny-" + a.arch;
  }
  ModelConfig c = config_preset(preset);  // throws, listing the presets
  if (!a.arch.empty()) {
    const std::optional<ModelArch> arch = arch_from_name(a.arch);
    if (!arch) {
      fail(ErrorKind::kInvalidArgument, "--arch {}: unknown architecture ({})", a.arch,
           fmt::join(arch_names(), ", "));
    }
    if (*arch != c.arch) {
      fail(ErrorKind::kInvalidArgument, "--arch {} does not match --preset {} (a {} model)", a.arch,
           a.preset, arch_name(c.arch));
    }
  }
  if (a.layers_option && a.layers_option->count() > 0) {
    if (a.layers < 1 || a.layers > 1000) {
      fail(ErrorKind::kInvalidArgument, "--layers {}: must be in [1, 1000]", a.layers);
    }
    // A truncated model keeps the first layers of the real one, dense lead included.
    c.num_layers = a.layers;
    c.first_k_dense_replace = std::min(c.first_k_dense_replace, c.num_layers);
    std::erase_if(c.mlp_only_layers, [&](int64_t l) { return l >= c.num_layers; });
    if (c.num_moe_layers() == 0) {
      log_warn("synth: with {} layers the {} shape has no MoE layer", a.layers, preset);
    }
  }
  *preset_name = preset;
  return c;
}

void run_synth(const SynthArgs& a) {
  SynthOptions o;
  std::string preset;
  o.config = resolve_config(a, &preset);
  o.name = a.name.empty() ? "synth-" + preset : a.name;
  o.format = a.format == "hf" ? SynthFormat::kHf : SynthFormat::kGguf;
  const std::string type =
      a.type.empty() ? (o.format == SynthFormat::kHf ? "bf16" : "f32") : a.type;
  const std::optional<SynthType> t = synth_type_from_name(type);
  if (!t || !synth_type_allowed(*t, o.format)) {
    fail(ErrorKind::kInvalidArgument,
         "--type {} is not available for --format {} (gguf: {}; hf: bf16, fp8, mxfp4_moe, int4-ct, fp8-ct, gptq-int4)", type,
         a.format, synth_gguf_type_list());
  }
  o.type = *t;
  o.seed = a.seed;
  o.vocab_gguf = a.vocab;
  o.output = a.output;
  o.threads = a.threads;
  o.hf_shard_bytes = a.shard_bytes;
  if (a.assume_free_disk > 0) o.free_disk_bytes = a.assume_free_disk;
  if (a.assume_free_ram > 0) o.free_ram_bytes = a.assume_free_ram;
  const SynthPlan plan = synth_model(o);
  fmt::print("wrote {}: {} ({}), {} {}, {} tensors, {}\n", a.output, preset,
             arch_name(plan.config.arch), a.format, type, plan.tensors.size(),
             format_bytes_si(plan.file_bytes));
}

void add_synth(CLI::App& app) {
  auto args = std::make_shared<SynthArgs>();
  app.add_option("--arch", args->arch, fmt::format("{}", fmt::join(arch_names(), ", ")))
      ->check(CLI::IsMember(arch_names()));
  std::vector<std::string> presets = {"tiny"};
  for (const std::string& p : config_preset_names()) presets.push_back(p);
  app.add_option("--preset", args->preset,
                 "tiny (needs --arch), a tiny-<arch> shape or a released model's shape")
      ->check(CLI::IsMember(presets));
  app.add_option("--format", args->format, "gguf (default) or hf")
      ->check(CLI::IsMember({"gguf", "hf"}));
  app.add_option(
      "--type", args->type,
      "gguf: f32 (default), f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, "
      "q6_k, q4_k_m, q5_k_m, mxfp4_moe; hf: bf16 (default), fp8, int4-ct (the routed experts in "
      "compressed-tensors INT4, as Kimi-K2.5 ships them), fp8-ct (compressed-tensors FP8 with "
      "a scale per row, as the FP8-dynamic releases ship them), gptq-int4 (GPTQ's INT4, groups "
      "of 128), mxfp4_moe (gpt-oss: its "
      "release's MXFP4 experts)");
  app.add_option("--seed", args->seed, "random seed (same seed, same bytes)");
  app.add_option("--vocab", args->vocab,
                 "copy the tokenizer of this GGUF file (sets the vocab size)")
      ->check(CLI::ExistingFile);
  args->layers_option =
      app.add_option("--layers", args->layers, "keep only the first N layers of the shape");
  app.add_option("-o,--output", args->output, "output .gguf file or HF directory")->required();
  app.add_option("--name", args->name, "general.name (default synth-<preset>)");
  app.add_option("--threads", args->threads, "worker threads (default: all)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--shard-bytes", args->shard_bytes, "HF shard size (default 5 GB)");
  app.add_option("--assume-free-disk", args->assume_free_disk,
                 "testing: pretend this many bytes of disk are free");
  app.add_option("--assume-free-ram", args->assume_free_ram,
                 "testing: pretend this many bytes of RAM are available");
  app.callback([args] { run_synth(*args); });
}

Registrar reg("synth", "Write a random-weight model (GGUF or HF) of a supported architecture",
              add_synth);

}  // namespace
}  // namespace tandem::tools
