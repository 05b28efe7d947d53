// cuBLAS, loaded at its first use (dlopen of the libcublas.so.N this build was compiled against,
// from the loader's search path, else from that toolkit's library folder):
// a CUDA build starts without mapping cuBLAS's libraries (some 600 MB, 0.1 s and 200 MB of
// resident memory per process) and runs where they are missing, its products then staying on
// tandem's own kernels (ops/cuda/matvec.h).
#pragma once

#include <cublas_v2.h>

#include <string>

namespace tandem {

struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  // (the library's symbol; the header overloads the name for C++)
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The loaded functions, or nullptr (then *why, if given, says what was missing). Loads once;
// thread-safe.
const CublasApi* cublas_api(std::string* why = nullptr);

}  // namespace tandem
