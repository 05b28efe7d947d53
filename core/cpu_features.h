// What the CPU can execute, detected once (a true process fact, so a singleton), and the ISA
// ladder kernels are dispatched on. The environment variable
// TANDEM_ISA=avx2|avx512|avx512_vnni|avx512_bf16|amx caps the choice (to test or benchmark a lower
// ISA on a bigger CPU).
#pragma once

#include <string>
#include <vector>

namespace tandem {

struct CpuFeatures {
  std::string vendor;
  std::string model_name;
  bool avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx_vnni = false;                                       // VEX-encoded VNNI (AVX2 width)
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx512_vbmi = false;
  bool avx512_bitalg = false;  // VPSHUFBITQMB (Ice Lake+, Zen 4+)
  bool gfni = false;           // GF2P8AFFINEQB (Ice Lake+, Zen 4+): usable at 512 bits here
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;  // and the OS granted tile state
};

// The ISA levels kernels are written for, in increasing order. Each level implies the ones below.
enum class Isa {
  kScalar = 0,      // portable C++: the reference
  kAvx2 = 1,        // AVX2 + FMA + F16C (the baseline)
  kAvx512 = 2,      // AVX-512 F/BW/VL/DQ (Skylake-SP)
  kAvx512Vnni = 3,  // + AVX-512 VNNI (Cascade Lake, Ice Lake): the integer dot products
  kAvx512Bf16 = 4,  // + AVX-512 BF16 (Cooper Lake, Zen 4+)
  kAmx = 5,         // + AMX tiles INT8/BF16 (Sapphire Rapids+)
};

const char* isa_name(Isa isa);
bool parse_isa(const std::string& name, Isa* isa);

const CpuFeatures& cpu_features();
// The highest level whose features `f` has all of (without the TANDEM_ISA cap).
Isa isa_level(const CpuFeatures& f);
// The best ISA this CPU supports (capped by TANDEM_ISA when set).
Isa best_isa();
// Every ISA level this CPU supports, scalar first (what conformance tests iterate over).
std::vector<Isa> supported_isas();
// A comma-separated list of the detected features, for `tandem info`.
std::string cpu_feature_string(const CpuFeatures& f);

}  // namespace tandem
