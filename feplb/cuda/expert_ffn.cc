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


void gemm(cublasHandle_t handle, cudaStream_t stream, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          const bf16* a, const bf16* b, void* c, bool c_f32, float beta) {
  if (m == 0 || n == 0) return;
  const float one = 1.0f;
  FEPLB_CUBLAS_CHECK(cublasSetStream(handle, stream));
  // Column-major view of row-major buffers: C^T [n, m] = op(B)^T [n, k] * op(A)^T [k, m].
  const int lda = static_cast<int>(trans_a ? m : k), ldb = static_cast<int>(trans_b ? k : n);
  FEPLB_CUBLAS_CHECK(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one, b, CUDA_R_16BF,
                                  ldb, a, CUDA_R_16BF, lda, &beta, c, c_f32 ? CUDA_R_32F : CUDA_R_16BF,
                                  static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void expert_ffn_backward(cublasHandle_t handle, cudaStream_t stream, const bf16* x, int64_t rows, const bf16* w,
                         const bf16* gu, const bf16* act, const bf16* dy, float* grad_w, float beta, bf16* dx,
                         bf16* dgu, bf16* dact, int64_t hidden, int64_t ffn) {
  const int64_t H = hidden, F = ffn;
  const bf16* w_gu = w;                // [H, 2F]
  const bf16* w_down = w + 2 * H * F;  // [F, H]
  float* g_gu = grad_w;                // [H, 2F]
  float* g_down = grad_w + 2 * H * F;  // [F, H]
  if (rows == 0) {
    if (beta == 0.0f) FEPLB_CUDA_CHECK(cudaMemsetAsync(grad_w, 0, 3 * H * F * sizeof(float), stream));
    return;
  }
  gemm(handle, stream, true, false, F, H, rows, act, dy, g_down, true, beta);    // dWd = act^T dy
  gemm(handle, stream, false, true, rows, F, H, dy, w_down, dact, false, 0.f);   // dact = dy Wd^T
  FEPLB_CUDA_CHECK(kernels::swiglu_backward(gu, dact, rows, F, dgu, stream));    // d gate|up
  gemm(handle, stream, true, false, H, 2 * F, rows, x, dgu, g_gu, true, beta);  // dWgu = x^T dgu
  gemm(handle, stream, false, true, rows, H, 2 * F, dgu, w_gu, dx, false, 0.f);  // dx = dgu Wgu^T
}

}  // namespace feplb::cuda
