#include "core/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "core/log.h"

namespace tandem {
namespace {

constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool leaf(unsigned op, unsigned sub, unsigned r[4]) {
  return __get_cpuid_count(op, sub, &r[0], &r[1], &r[2], &r[3]) != 0;
}

unsigned long long xgetbv0() {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

// Linux only grants AMX tile data to processes that ask (arch_prctl ARCH_REQ_XCOMP_PERM).
bool request_amx_permission() {
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long long bitmask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &bitmask) != 0) return false;
  return (bitmask & (1ull << kXfeatureXtiledata)) != 0;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned r[4] = {0, 0, 0, 0};
  if (!leaf(0, 0, r)) return f;
  const unsigned max_leaf = r[0];
  char vendor[13] = {0};
  std::memcpy(vendor + 0, &r[1], 4);
  std::memcpy(vendor + 4, &r[3], 4);
  std::memcpy(vendor + 8, &r[2], 4);
  f.vendor = vendor;

  unsigned ext[4] = {0, 0, 0, 0};
  if (leaf(0x80000000u, 0, ext) && ext[0] >= 0x80000004u) {
    char brand[49] = {0};
    for (unsigned i = 0; i < 3; ++i) {
      unsigned b[4];
      leaf(0x80000002u + i, 0, b);
      std::memcpy(brand + 16 * i, b, 16);
    }
    std::string name = brand;
    while (!name.empty() && (name.back() == ' ' || name.back() == '\0')) name.pop_back();
    while (!name.empty() && name.front() == ' ') name.erase(name.begin());
    f.model_name = name;
  }

  leaf(1, 0, r);
  const bool osxsave = (r[2] >> 27) & 1;
  const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;
  f.fma = os_avx && ((r[2] >> 12) & 1);
  f.f16c = os_avx && ((r[2] >> 29) & 1);

  if (max_leaf >= 7) {
    leaf(7, 0, r);
    const unsigned ebx = r[1], ecx = r[2], edx = r[3];
    f.avx2 = os_avx && ((ebx >> 5) & 1);
    f.bmi2 = (ebx >> 8) & 1;
    f.avx512f = os_avx512 && ((ebx >> 16) & 1);
    f.avx512dq = os_avx512 && ((ebx >> 17) & 1);
    f.avx512bw = os_avx512 && ((ebx >> 30) & 1);
    f.avx512vl = os_avx512 && ((ebx >> 31) & 1);
    f.avx512_vbmi = os_avx512 && ((ecx >> 1) & 1);
    f.avx512_bitalg = os_avx512 && ((ecx >> 12) & 1);
    f.gfni = os_avx512 && ((ecx >> 8) & 1);
    f.avx512_vnni = os_avx512 && ((ecx >> 11) & 1);
    const bool amx_bf16 = (edx >> 22) & 1, amx_tile = (edx >> 24) & 1, amx_int8 = (edx >> 25) & 1;
    unsigned s1[4] = {0, 0, 0, 0};
    leaf(7, 1, s1);
    f.avx_vnni = os_avx && ((s1[0] >> 4) & 1);
    f.avx512_bf16 = os_avx512 && ((s1[0] >> 5) & 1);
    if (os_amx && amx_tile && request_amx_permission()) {
      f.amx_tile = true;
      f.amx_int8 = amx_int8;
      f.amx_bf16 = amx_bf16;
    }
  }
  return f;
}

}  // namespace

Isa isa_level(const CpuFeatures& f) {
  Isa isa = Isa::kScalar;
  if (f.avx2 && f.fma && f.f16c) isa = Isa::kAvx2;
  if (isa == Isa::kAvx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) isa = Isa::kAvx512;
  if (isa == Isa::kAvx512 && f.avx512_vnni) isa = Isa::kAvx512Vnni;
  if (isa == Isa::kAvx512Vnni && f.avx512_bf16) isa = Isa::kAvx512Bf16;
  if (isa == Isa::kAvx512Bf16 && f.amx_tile && f.amx_int8 && f.amx_bf16) isa = Isa::kAmx;
  return isa;
}

namespace {

Isa detect_best(const CpuFeatures& f) {
  Isa isa = isa_level(f);
  if (const char* cap = std::getenv("TANDEM_ISA")) {
    Isa limit;
    if (!parse_isa(cap, &limit)) {
      log_warn("TANDEM_ISA={} is not one of scalar, avx2, avx512, avx512_vnni, avx512_bf16, amx; "
               "ignored", cap);
    } else if (limit < isa) {
      isa = limit;
    }
  }
  return isa;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Vnni: return "avx512_vnni";
    case Isa::kAvx512Bf16: return "avx512_bf16";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

bool parse_isa(const std::string& name, Isa* isa) {
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni, Isa::kAvx512Bf16,
                 Isa::kAmx}) {
    if (name == isa_name(i)) {
      *isa = i;
      return true;
    }
  }
  return false;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

Isa best_isa() {
  static const Isa isa = detect_best(cpu_features());
  return isa;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (int i = 0; i <= static_cast<int>(best_isa()); ++i) out.push_back(static_cast<Isa>(i));
  return out;
}

std::string cpu_feature_string(const CpuFeatures& f) {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx_vnni, "avx_vnni");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512dq, "avx512dq");
  add(f.avx512_vbmi, "avx512_vbmi");
  add(f.avx512_bitalg, "avx512_bitalg");
  add(f.gfni, "gfni");
  add(f.avx512_vnni, "avx512_vnni");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.amx_tile, "amx_tile");
  add(f.amx_int8, "amx_int8");
  add(f.amx_bf16, "amx_bf16");
  return s;
}

}  // namespace tandem
