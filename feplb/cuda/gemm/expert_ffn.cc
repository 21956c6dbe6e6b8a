#include "feplb/cuda/gemm/expert_ffn.h"

#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/runtime/check.h"

namespace feplb::cuda {

void expert_ffn(GemmEngine& gemm, cudaStream_t stream, const bf16* x, int64_t rows,
                const bf16* w_gate_up, const bf16* w_down, bf16* gu, bf16* act, bf16* y,
                int64_t hidden, int64_t ffn) {
  if (rows == 0) return;
  gemm_bf16(gemm, stream, x, w_gate_up, gu, rows, 2 * ffn, hidden);  // gu [rows, 2F]
  FEPLB_CUDA_CHECK(kernels::swiglu(gu, rows, ffn, act, stream));     // act [rows, F]
  gemm_bf16(gemm, stream, act, w_down, y, rows, hidden, ffn);        // y [rows, H]
}

void expert_ffn_backward(GemmEngine& gemm, cudaStream_t stream, const bf16* x, int64_t rows,
                         const bf16* w_gate_up, const bf16* w_down, const bf16* gu, const bf16* act,
                         const bf16* dy, void* g_gate_up, void* g_down, bool g_f32, float beta,
                         bf16* dx, bf16* dgu, bf16* dact, int64_t hidden, int64_t ffn) {
  const int64_t H = hidden, F = ffn;
  if (rows == 0) {
    if (beta == 0.0f) {
      const size_t elem = g_f32 ? sizeof(float) : sizeof(bf16);
      FEPLB_CUDA_CHECK(
          cudaMemsetAsync(g_gate_up, 0, static_cast<size_t>(2 * H * F) * elem, stream));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(g_down, 0, static_cast<size_t>(H * F) * elem, stream));
    }
    return;
  }
  gemm.run(stream, true, false, F, H, rows, act, dy, g_down, g_f32, beta, true);  // dWd = act^T dy
  gemm.run(stream, false, true, rows, F, H, dy, w_down, dact, false, 0.f);        // dact = dy Wd^T
  FEPLB_CUDA_CHECK(kernels::swiglu_backward(gu, dact, rows, F, dgu, stream));     // d gate|up
  gemm.run(stream, true, false, H, 2 * F, rows, x, dgu, g_gate_up, g_f32, beta,
           true);                                                                 // dWgu = x^T dgu
  gemm.run(stream, false, true, rows, H, 2 * F, dgu, w_gate_up, dx, false, 0.f);  // dx = dgu Wgu^T
}

}  // namespace feplb::cuda
