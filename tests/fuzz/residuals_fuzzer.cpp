// libFuzzer target: residual-vector files (`tandem calibrate`, runtime/calibrate.h) on arbitrary
// text: parsed, or refused with an Error naming the key.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "runtime/calibrate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const tandem::rt::ResidualVectors r = tandem::rt::ResidualVectors::parse(
        std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
    return static_cast<int>(r.vectors.size() & 0);
  } catch (const tandem::Error&) {
    return 0;
  }
}
