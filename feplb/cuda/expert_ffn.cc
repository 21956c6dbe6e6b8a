#include "feplb/cuda/expert_ffn.h"

#include "feplb/cuda/check.h"
#include "feplb/cuda/kernels/kernels.h"

namespace feplb::cuda {

void gemm_bf16(cublasHandle_t handle, cudaStream_t stream, const bf16* a, const bf16* b, bf16* c,
               int64_t m, int64_t n, int64_t k) {
  if (m == 0) return;
  const float one = 1.0f, zero = 0.0f;
  FEPLB_CUBLAS_CHECK(cublasSetStream(handle, stream));
  // Column-major view: C^T [n, m] = B^T [n, k] * A^T [k, m].
  FEPLB_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                  static_cast<int>(k), &one, b, CUDA_R_16BF, static_cast<int>(n), a, CUDA_R_16BF,
                                  static_cast<int>(k), &zero, c, CUDA_R_16BF, static_cast<int>(n),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void expert_ffn(cublasHandle_t handle, cudaStream_t stream, const bf16* x, int64_t rows, const bf16* w,
                bf16* gu, bf16* act, bf16* y, int64_t hidden, int64_t ffn) {
  if (rows == 0) return;
  const bf16* w_gu = w;                        // [H, 2F]
  const bf16* w_down = w + 2 * hidden * ffn;   // [F, H]
  gemm_bf16(handle, stream, x, w_gu, gu, rows, 2 * ffn, hidden);
  FEPLB_CUDA_CHECK(kernels::swiglu(gu, rows, ffn, act, stream));
  gemm_bf16(handle, stream, act, w_down, y, rows, hidden, ffn);
}

}  // namespace feplb::cuda
