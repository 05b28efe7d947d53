// libFuzzer target: the routing-trace reader (runtime/trace.h, "TDTRACE1") on arbitrary bytes,
// then what `tandem sim` derives from a trace first (batches, per-expert counts). A header must
// be refused before anything is sized from it: the fuzzer's malloc limit catches the opposite.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "runtime/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const tandem::rt::Trace t = tandem::rt::parse_trace("fuzz.trace", data, size);
    size_t sink = tandem::rt::trace_batches(t).size();
    for (const auto& layer : tandem::rt::expert_counts(t)) sink += layer.size();
    sink += static_cast<size_t>(tandem::rt::prediction_recall(t, false) > 0);
    return static_cast<int>(sink & 0);
  } catch (const tandem::Error&) {
    return 0;
  }
}
