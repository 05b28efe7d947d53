// Where each part of a model runs: defaults (embeddings, attention, dense FFNs, routers, shared
// experts, lm_head on the accelerator; routed experts in host DRAM) overridden by a YAML rules file
// in the spirit of KTransformers' injection rules: a list of {match: {name, module}, device, dtype,
// cpu_experts, op}, first match wins. The resolved placement is printed by `tandem run -v` and
// `--show-placement`. The run follows every module's device: the dense part (embedding, attention,
// dense FFNs, routers, lm_head) as a whole on the accelerator's ForwardOps or the CPU's, the shared
// experts and routed experts per layer in the hybrid MoE backend; dtype and op are recorded only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/weights.h"

namespace tandem::rt {

enum class Where : uint8_t { kCpu, kAccel };
const char* where_name(Where w);

struct PlacementRule {
  std::string name;    // PCRE2 regex (<= 1 KiB, groups nested <= 32 deep), must match the whole
                       // module name; empty: any
  std::string module;  // embedding|attention|dense|router|shared|experts|lm_head|moe; empty: any
  bool has_device = false;
  Where device = Where::kCpu;
  std::string dtype;        // dtype on the accelerator (recorded; stored dtype used for now)
  std::string cpu_experts;  // native|repack|int8|int4|bf16 for routed experts in host DRAM
  std::string op;           // backend op: default|fused|reference
  std::string origin;       // "file:line" of the rule
};

// Parses a rules document; `source` names it in errors ("rules.yaml"). Throws Error naming
// source:line and the offending key / value.
std::vector<PlacementRule> parse_placement_rules(const std::string& text, const std::string& source);
std::vector<PlacementRule> load_placement_rules(const std::filesystem::path& path);

struct PlacedModule {
  std::string name;    // embed, layers.L.attention, layers.L.ffn, layers.L.router,
                       // layers.L.shared_experts, layers.L.experts, lm_head
  std::string module;  // embedding|attention|dense|router|shared|experts|lm_head
  int64_t layer = -1;
  Where device = Where::kCpu;
  std::string dtype;        // stored dtype unless a rule says otherwise
  std::string cpu_experts;  // experts only
  std::string op = "default";
  std::string rule = "default";  // "default" or the rule's file:line
};

struct Placement {
  std::vector<PlacedModule> modules;
  const PlacedModule* find(const std::string& name) const;
  // MoE-part queries the hybrid backend uses (layer = model layer index).
  bool shared_on_accel(int64_t layer) const;
  bool experts_pinned(int64_t layer) const;      // a rule put the whole layer on the accelerator
  bool experts_cpu_only(int64_t layer) const;    // a rule kept the layer in DRAM (no caching)
  // Where the dense part runs: the embedding, attention, dense FFNs and lm_head, which must agree
  // (Error(kUnsupported) naming two that do not and their rules); the routers follow it.
  Where dense_device() const;
  std::string format() const;  // one line per module, for -v / --show-placement
};

// "8G", "512M", "64K", "1.5G", "4096" (bytes; binary units) -> bytes; Error naming `flag` otherwise.
uint64_t parse_bytes(const std::string& flag, const std::string& text);

// have_accel false: everything resolves to the CPU (rules asking for accel are noted as such).
Placement resolve_placement(const LoadedModel& model, const std::vector<PlacementRule>& rules,
                            bool have_accel, const std::string& cpu_experts_default);

}  // namespace tandem::rt
