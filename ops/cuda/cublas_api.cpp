#include "ops/cuda/cublas_api.h"

#include <dlfcn.h>

namespace tandem {

namespace {

struct Loaded {
  CublasApi api;
  bool ok = false;
  std::string why;
};

template <typename F>
bool bind(void* lib, const char* name, F* f, std::string* why) {
  *f = reinterpret_cast<F>(dlsym(lib, name));
  if (*f == nullptr) *why = std::string("no ") + name + " in it";
  return *f != nullptr;
}

Loaded load() {
  Loaded l;
  const std::string file = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  // The loader's search path (LD_LIBRARY_PATH, ld.so.cache), then the toolkit built against.
  void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    l.why = file + ": " + (e != nullptr ? e : "not found");
    const std::string in_toolkit = std::string(TANDEM_CUDA_LIBRARY_DIR) + "/" + file;
    lib = dlopen(in_toolkit.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return l;
  }
  CublasApi& a = l.api;
  l.ok = bind(lib, "cublasCreate_v2", &a.create, &l.why) &&
         bind(lib, "cublasDestroy_v2", &a.destroy, &l.why) &&
         bind(lib, "cublasSetStream_v2", &a.set_stream, &l.why) &&
         bind(lib, "cublasSgemm_v2", &a.sgemm, &l.why) &&
         bind(lib, "cublasGemmEx", &a.gemm_ex, &l.why) &&
         bind(lib, "cublasGetStatusString", &a.status_string, &l.why);
  if (!l.ok) l.why = file + ": " + l.why;
  return l;  // (the library stays loaded for the process)
}

}  // namespace

const CublasApi* cublas_api(std::string* why) {
  static const Loaded loaded = load();
  if (!loaded.ok && why != nullptr) *why = loaded.why;
  return loaded.ok ? &loaded.api : nullptr;
}

}  // namespace tandem
