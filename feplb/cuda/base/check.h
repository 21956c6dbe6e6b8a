// Check macros for every external GPU API: each failure throws feplb::Error carrying the call,
// file:line and the API's own error string. *_WARN variants only print (for destructors).
#pragma once

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdio>

#include "feplb/core/error.h"

#define FEPLB_CUDA_CHECK(call)                                                       \
  do {                                                                               \
    const cudaError_t feplb_err_ = (call);                                           \
    if (feplb_err_ != cudaSuccess)                                                   \
      ::feplb::fail_internal(                                                        \
          __FILE__, __LINE__,                                                        \
          fmt::format("{}: CUDA error {} ({})", #call, cudaGetErrorName(feplb_err_), \
                      cudaGetErrorString(feplb_err_)));                              \
  } while (0)

// Driver API calls made through entry points (feplb does not link libcuda, so no cuGetErrorString).
#define FEPLB_CU_CHECK(call)                                                             \
  do {                                                                                   \
    const CUresult feplb_res_ = (call);                                                  \
    if (feplb_res_ != CUDA_SUCCESS)                                                      \
      ::feplb::fail_internal(                                                            \
          __FILE__, __LINE__,                                                            \
          fmt::format("{}: CUDA driver error {}", #call, static_cast<int>(feplb_res_))); \
  } while (0)

#define FEPLB_CUBLAS_CHECK(call)                                                         \
  do {                                                                                   \
    const cublasStatus_t feplb_st_ = (call);                                             \
    if (feplb_st_ != CUBLAS_STATUS_SUCCESS)                                              \
      ::feplb::fail_internal(                                                            \
          __FILE__, __LINE__,                                                            \
          fmt::format("{}: cuBLAS error {} ({})", #call, cublasGetStatusName(feplb_st_), \
                      cublasGetStatusString(feplb_st_)));                                \
  } while (0)

#define FEPLB_CUDA_WARN(call)                                                   \
  do {                                                                          \
    const cudaError_t feplb_err_ = (call);                                      \
    if (feplb_err_ != cudaSuccess)                                              \
      std::fprintf(stderr, "feplb: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(feplb_err_));                             \
  } while (0)
