#include "runtime/placement.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "core/dtype.h"
#include "core/log.h"
#include "core/error.h"

namespace tandem::rt {
namespace {

const char* const kModules[] = {"embedding", "attention", "dense", "router",
                                "shared",    "experts",   "lm_head", "moe"};
const char* const kCpuExperts[] = {"native", "repack", "int8", "int4", "bf16"};
const char* const kOps[] = {"default", "fused", "reference"};

template <size_t N>
bool one_of(const std::string& v, const char* const (&set)[N]) {
  for (const char* s : set)
    if (v == s) return true;
  return false;
}

template <size_t N>
std::string join(const char* const (&set)[N]) {
  std::string r;
  for (const char* s : set) r += (r.empty() ? "" : "|") + std::string(s);
  return r;
}

std::string where(const std::string& source, const YAML::Node& n) {
  return fmt::format("{}:{}", source, n.Mark().line + 1);
}

std::string scalar(const std::string& source, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) fail(ErrorKind::kFormat, "{}: '{}' must be a string", where(source, n), key);
  return n.as<std::string>();
}

bool matches(const PlacementRule& r, const std::string& name, const std::string& module,
             const std::regex* re) {
  if (!r.module.empty()) {
    const bool moe_part = module == "router" || module == "shared" || module == "experts";
    if (!(r.module == module || (r.module == "moe" && moe_part))) return false;
  }
  return re == nullptr || std::regex_match(name, *re);
}

}  // namespace

uint64_t parse_bytes(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() > 1 && (unit.back() == 'i')) unit.pop_back();
  double mul = 0;
  if (unit.empty()) mul = 1;
  else if (unit == "K" || unit == "k") mul = 1024.0;
  else if (unit == "M" || unit == "m") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") mul = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "t") mul = 1024.0 * 1024 * 1024 * 1024;
  if (used == 0 || mul == 0 || !(v >= 0) || v * mul > 1e15) {
    fail(ErrorKind::kInvalidArgument, "{} '{}': expected a size such as 8G, 512M or 4096", flag,
         text);
  }
  return static_cast<uint64_t>(v * mul);
}

const char* where_name(Where w) { return w == Where::kAccel ? "accel" : "cpu"; }

std::vector<PlacementRule> parse_placement_rules(const std::string& text,
                                                 const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(ErrorKind::kFormat, "{}:{}: bad YAML: {}", source, e.mark.line + 1, e.msg);
  }
  std::vector<PlacementRule> rules;
  if (root.IsNull()) return rules;
  if (!root.IsSequence()) {
    fail(ErrorKind::kFormat, "{}: the rules file must be a list of rules (- match: ...)",
         where(source, root));
  }
  for (const YAML::Node& item : root) {
    if (!item.IsMap()) fail(ErrorKind::kFormat, "{}: a rule must be a mapping", where(source, item));
    PlacementRule r;
    r.origin = where(source, item);
    bool has_match = false;
    for (const auto& kv : item) {
      const std::string key = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      if (key == "match") {
        has_match = true;
        if (!v.IsMap()) fail(ErrorKind::kFormat, "{}: 'match' must be a mapping", where(source, v));
        for (const auto& m : v) {
          const std::string mk = m.first.as<std::string>();
          if (mk == "name") {
            r.name = scalar(source, m.second, "match.name");
            try {
              std::regex test(r.name);
            } catch (const std::regex_error& e) {
              fail(ErrorKind::kFormat, "{}: match.name '{}' is not a valid regex: {}",
                   where(source, m.second), r.name, e.what());
            }
          } else if (mk == "module") {
            r.module = scalar(source, m.second, "match.module");
            if (!one_of(r.module, kModules)) {
              fail(ErrorKind::kFormat, "{}: match.module '{}' is not one of {}",
                   where(source, m.second), r.module, join(kModules));
            }
          } else {
            fail(ErrorKind::kFormat, "{}: unknown key 'match.{}' (name, module)",
                 where(source, m.first), mk);
          }
        }
      } else if (key == "device") {
        const std::string d = scalar(source, v, key);
        if (d != "cpu" && d != "accel") {
          fail(ErrorKind::kFormat, "{}: device '{}' is not cpu or accel", where(source, v), d);
        }
        r.has_device = true;
        r.device = d == "accel" ? Where::kAccel : Where::kCpu;
      } else if (key == "dtype") {
        r.dtype = scalar(source, v, key);
        if (!dtype_from_name(r.dtype)) {
          fail(ErrorKind::kFormat, "{}: dtype '{}' is unknown", where(source, v), r.dtype);
        }
      } else if (key == "cpu_experts") {
        r.cpu_experts = scalar(source, v, key);
        if (!one_of(r.cpu_experts, kCpuExperts)) {
          fail(ErrorKind::kFormat, "{}: cpu_experts '{}' is not one of {}", where(source, v),
               r.cpu_experts, join(kCpuExperts));
        }
      } else if (key == "op") {
        r.op = scalar(source, v, key);
        if (!one_of(r.op, kOps)) {
          fail(ErrorKind::kFormat, "{}: op '{}' is not one of {}", where(source, v), r.op,
               join(kOps));
        }
      } else {
        fail(ErrorKind::kFormat,
             "{}: unknown key '{}' (match, device, dtype, cpu_experts, op)", where(source, kv.first),
             key);
      }
    }
    if (!has_match) fail(ErrorKind::kFormat, "{}: rule has no 'match'", r.origin);
    rules.push_back(std::move(r));
  }
  return rules;
}

std::vector<PlacementRule> load_placement_rules(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::kIo, "--rules: cannot read '{}'", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_placement_rules(ss.str(), path.string());
}

const PlacedModule* Placement::find(const std::string& name) const {
  for (const PlacedModule& m : modules)
    if (m.name == name) return &m;
  return nullptr;
}

bool Placement::shared_on_accel(int64_t layer) const {
  const PlacedModule* m = find(fmt::format("layers.{}.shared_experts", layer));
  return m != nullptr && m->device == Where::kAccel;
}

bool Placement::experts_pinned(int64_t layer) const {
  const PlacedModule* m = find(fmt::format("layers.{}.experts", layer));
  return m != nullptr && m->device == Where::kAccel;
}

bool Placement::experts_cpu_only(int64_t layer) const {
  const PlacedModule* m = find(fmt::format("layers.{}.experts", layer));
  return m != nullptr && m->device == Where::kCpu && m->rule != "default";
}

std::string Placement::format() const {
  std::string s = "placement (module, kind, device, dtype, op, rule; * = followed at run time):";
  for (const PlacedModule& m : modules) {
    std::string dt = m.dtype;
    if (!m.cpu_experts.empty()) dt += "/cpu:" + m.cpu_experts;
    s += fmt::format("\n  {:<26} {:<9} {:<5}{} {:<14} {:<9} {}", m.name, m.module,
                     where_name(m.device), m.executes ? "*" : " ", dt, m.op, m.rule);
  }
  return s;
}

Placement resolve_placement(const LoadedModel& model, const std::vector<PlacementRule>& rules,
                            bool have_accel, const std::string& cpu_experts_default) {
  std::vector<std::unique_ptr<std::regex>> res;
  for (const PlacementRule& r : rules) {
    res.push_back(r.name.empty() ? nullptr : std::make_unique<std::regex>(r.name));
  }
  Placement p;
  auto add = [&](const std::string& name, const char* module, int64_t layer, const ops::Weight* w,
                 Where def) {
    PlacedModule m;
    m.name = name;
    m.module = module;
    m.layer = layer;
    m.device = def;
    m.dtype = w != nullptr && !w->empty() ? std::string(dtype_info(w->t.dtype).name) : std::string("-");
    const bool experts = m.module == "experts";
    if (experts) m.cpu_experts = cpu_experts_default;
    for (size_t i = 0; i < rules.size(); ++i) {
      const PlacementRule& r = rules[i];
      if (!matches(r, name, m.module, res[i].get())) continue;
      if (r.has_device) m.device = r.device;
      if (!r.dtype.empty()) m.dtype = r.dtype;
      if (!r.cpu_experts.empty() && experts) m.cpu_experts = r.cpu_experts;
      if (!r.op.empty()) m.op = r.op;
      m.rule = r.origin;
      // Only `device` is followed at run time (for the MoE part); say so rather than ignore.
      if (!r.dtype.empty() || !r.op.empty() || (!r.cpu_experts.empty() && experts)) {
        log_warn("{}: {}: dtype / op / cpu_experts are recorded in the placement but not applied "
                 "yet (the run uses the stored dtype and --cpu-experts)",
                 r.origin, name);
      }
      break;  // first match wins
    }
    if (!have_accel && m.device == Where::kAccel) {
      m.device = Where::kCpu;
      if (m.rule == "default") m.rule = "default (no accelerator)";
      else m.rule += " (no accelerator)";
    }
    // The MoE part follows the placement now; other modules still run in the model's CPU code.
    m.executes = m.module == "shared" || m.module == "experts" || m.device == Where::kCpu;
    p.modules.push_back(std::move(m));
  };
  const Where acc = have_accel ? Where::kAccel : Where::kCpu;
  add("embed", "embedding", -1, nullptr, acc);
  p.modules.back().dtype = std::string(dtype_info(model.embed.dtype).name);
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const LayerWeights& lw = model.layers[l];
    const int64_t li = static_cast<int64_t>(l);
    const std::string pre = fmt::format("layers.{}.", l);
    add(pre + "attention", "attention", li, lw.wo.empty() ? nullptr : &lw.wo, acc);
    if (!lw.moe) {
      add(pre + "ffn", "dense", li, &lw.ffn_gate, acc);
      continue;
    }
    add(pre + "router", "router", li, &lw.router, acc);
    if (!lw.sh_gate.empty()) add(pre + "shared_experts", "shared", li, &lw.sh_gate, acc);
    add(pre + "experts", "experts", li,
        lw.experts.gate.empty() ? nullptr : &lw.experts.gate[0], Where::kCpu);
  }
  add("lm_head", "lm_head", -1, &model.lm_head, acc);
  return p;
}

}  // namespace tandem::rt
