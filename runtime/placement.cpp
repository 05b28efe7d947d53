#include "runtime/placement.h"

#include <fmt/ranges.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>
#include <yaml-cpp/yaml.h>

#include <memory>

#include "core/dtype.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/log.h"

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
  return fmt::format("{}", fmt::join(set, "|"));
}

std::string where(const std::string& source, const YAML::Node& n) {
  return fmt::format("{}:{}", source, n.Mark().line + 1);
}

std::string scalar(const std::string& source, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) fail(ErrorKind::kFormat, "{}: '{}' must be a string", where(source, n), key);
  return n.as<std::string>();
}

// A rule's match.name, compiled by PCRE2 with limits: a rules file is user input, and
// std::regex compiles recursively (100,000 characters or 2,000 nested groups overflow the stack)
// and backtracks without bound ("(.*.*.*.*)*X" never returns). The pattern must match the whole
// module name.
constexpr size_t kMaxNamePatternBytes = 1024;
constexpr uint32_t kMaxNameParensNest = 32;
constexpr uint32_t kNameMatchLimit = 100000;  // backtracking steps per match
constexpr uint32_t kNameDepthLimit = 1000;

class NamePattern {
 public:
  // Throws Error(kFormat) naming `where` when the pattern is too long, nested too deep or invalid.
  NamePattern(const std::string& pattern, const std::string& where) : pattern_(pattern) {
    if (pattern.size() > kMaxNamePatternBytes) {
      fail(ErrorKind::kFormat, "{}: match.name is {} bytes long, more than {}", where,
           pattern.size(), kMaxNamePatternBytes);
    }
    std::unique_ptr<pcre2_compile_context, decltype(&pcre2_compile_context_free)> cc(
        pcre2_compile_context_create(nullptr), &pcre2_compile_context_free);
    if (!cc) throw std::bad_alloc();
    pcre2_set_parens_nest_limit(cc.get(), kMaxNameParensNest);
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF, &err, &offset, cc.get()));
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      fail(ErrorKind::kFormat, "{}: match.name '{}' is not a valid regex: {} at offset {}", where,
           pattern, reinterpret_cast<const char*>(msg), offset);
    }
    pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE);  // the interpreter if JIT fails
    match_.reset(pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    context_.reset(pcre2_match_context_create(nullptr));
    if (!match_ || !context_) throw std::bad_alloc();
    pcre2_set_match_limit(context_.get(), kNameMatchLimit);
    pcre2_set_depth_limit(context_.get(), kNameDepthLimit);
  }

  // Whole-name match; throws Error(kFormat) naming `where` when the match limits are hit.
  bool matches(const std::string& name, const std::string& where) const {
    const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(),
                               0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, match_.get(), context_.get());
    if (rc >= 0) return true;
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof(msg));
    fail(ErrorKind::kFormat, "{}: match.name '{}' on '{}': {}", where, pattern_, name,
         reinterpret_cast<const char*>(msg));
  }

 private:
  struct Free {
    void operator()(pcre2_code* p) const { pcre2_code_free(p); }
    void operator()(pcre2_match_data* p) const { pcre2_match_data_free(p); }
    void operator()(pcre2_match_context* p) const { pcre2_match_context_free(p); }
  };
  std::string pattern_;
  std::unique_ptr<pcre2_code, Free> code_;
  std::unique_ptr<pcre2_match_data, Free> match_;
  std::unique_ptr<pcre2_match_context, Free> context_;
};

bool matches(const PlacementRule& r, const std::string& name, const std::string& module,
             const NamePattern* re) {
  if (!r.module.empty()) {
    const bool moe_part = module == "router" || module == "shared" || module == "experts";
    if (!(r.module == module || (r.module == "moe" && moe_part))) return false;
  }
  return re == nullptr || re->matches(name, r.origin);
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

namespace {

std::vector<PlacementRule> parse_rules(const YAML::Node& root, const std::string& source) {
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
            (void)NamePattern(r.name, where(source, m.second));  // refuses a bad one now
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

}  // namespace

std::vector<PlacementRule> parse_placement_rules(const std::string& text,
                                                 const std::string& source) {
  try {
    return parse_rules(YAML::Load(text), source);
  } catch (const YAML::Exception& e) {  // bad YAML, or a key that is no scalar
    if (e.mark.is_null()) fail(ErrorKind::kFormat, "{}: bad YAML: {}", source, e.msg);
    fail(ErrorKind::kFormat, "{}:{}: bad YAML: {}", source, e.mark.line + 1, e.msg);
  }
}

std::vector<PlacementRule> load_placement_rules(const std::filesystem::path& path) {
  return parse_placement_rules(read_input_file(path, kMaxConfigFileBytes, "--rules"),
                               path.string());
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
  std::string s = "placement (module, kind, device, dtype, op, rule):";
  for (const PlacedModule& m : modules) {
    std::string dt = m.dtype;
    if (!m.cpu_experts.empty()) dt += "/cpu:" + m.cpu_experts;
    s += fmt::format("\n  {:<26} {:<9} {:<5} {:<14} {:<9} {}", m.name, m.module,
                     where_name(m.device), dt, m.op, m.rule);
  }
  return s;
}

Placement resolve_placement(const LoadedModel& model, const std::vector<PlacementRule>& rules,
                            bool have_accel, const std::string& cpu_experts_default) {
  std::vector<std::unique_ptr<NamePattern>> res;
  for (const PlacementRule& r : rules) {
    res.push_back(r.name.empty() ? nullptr : std::make_unique<NamePattern>(r.name, r.origin));
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
      // Only `device` is followed at run time; say so rather than ignore.
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
  // The routers run where the dense part runs (their logits are the dense part's last product
  // before the routing); a rule that says otherwise is overridden, and says so.
  const Where dense = p.dense_device();  // (a dense part split between devices fails here)
  for (PlacedModule& m : p.modules) {
    if (m.module != "router" || m.device == dense) continue;
    if (m.rule.starts_with("default")) {
      m.device = dense;
      continue;
    }
    log_warn("placement: {} follows the dense part to the {} ({} asked for the {})", m.name,
             where_name(dense), m.rule, where_name(m.device));
    m.device = dense;
    m.rule += " (with the dense part)";
  }
  return p;
}

Where Placement::dense_device() const {
  const PlacedModule* first = nullptr;
  for (const PlacedModule& m : modules) {
    if (m.module == "shared" || m.module == "experts" || m.module == "router") continue;
    if (first == nullptr) {
      first = &m;
    } else if (m.device != first->device) {
      fail(ErrorKind::kUnsupported,
           "placement: {} is on the {} ({}) but {} on the {} ({}): the dense part (embedding, "
           "attention, dense FFNs, lm_head, and with them the routers) runs in one place, all on "
           "the accelerator or all on the cpu",
           first->name, where_name(first->device), first->rule, m.name, where_name(m.device),
           m.rule);
    }
  }
  return first != nullptr ? first->device : Where::kCpu;
}

}  // namespace tandem::rt
