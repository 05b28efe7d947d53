// libFuzzer target: placement rules (`--rules`, runtime/placement.h) on arbitrary YAML, resolved
// over a model skeleton (a dense layer, then MoE layers with shared experts): the YAML parser and
// PCRE2 with its compile and match limits on every module name.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "runtime/placement.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tandem::LoadedModel skeleton = [] {
    tandem::set_log_level(tandem::LogLevel::kError);  // rules that are recorded, not applied
    tandem::LoadedModel m;
    m.layers.resize(4);
    for (size_t l = 1; l < m.layers.size(); ++l) m.layers[l].moe = true;
    return m;
  }();
  try {
    const auto rules = tandem::rt::parse_placement_rules(
        std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
    for (bool accel : {false, true}) {
      const tandem::rt::Placement p =
          tandem::rt::resolve_placement(skeleton, rules, accel, "native");
      (void)p.format();
    }
  } catch (const tandem::Error&) {
  }
  return 0;
}
