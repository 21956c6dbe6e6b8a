#include "feplb/cuda/gemm/expert_ffn.h"

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/kernels/kernels.h"

namespace feplb::cuda {

void ffn_gate_up(GemmEngine& gemm, cudaStream_t stream, const bf16* x, int64_t rows,
                 const bf16* w_gate_up, bf16* gu, int64_t hidden, int64_t ffn) {
  if (rows == 0) return;
  gemm_bf16(gemm, stream, x, w_gate_up, gu, rows, 2 * ffn, hidden);  // gu [rows, 2F]
}

void ffn_down(GemmEngine& gemm, cudaStream_t stream, const bf16* act, int64_t rows,
              const bf16* w_down, bf16* y, int64_t hidden, int64_t ffn) {
  if (rows == 0) return;
  gemm_bf16(gemm, stream, act, w_down, y, rows, hidden, ffn);  // y [rows, H]
}

void expert_ffn(GemmEngine& gemm, cudaStream_t stream, const bf16* x, int64_t rows,
                const bf16* w_gate_up, const bf16* w_down, bf16* gu, bf16* act, bf16* y,
                int64_t hidden, int64_t ffn) {
  if (rows == 0) return;
  ffn_gate_up(gemm, stream, x, rows, w_gate_up, gu, hidden, ffn);
  FEPLB_CUDA_CHECK(kernels::swiglu(gu, rows, ffn, act, stream));  // act [rows, F]
  ffn_down(gemm, stream, act, rows, w_down, y, hidden, ffn);
}

void ffn_backward_down(GemmEngine& gemm, cudaStream_t stream, int64_t rows, const bf16* w_down,
                       const bf16* act, const bf16* dy, void* g_gate_up, void* g_down, bool g_f32,
                       float beta, bf16* dact, int64_t hidden, int64_t ffn) {
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
}

void ffn_backward_gate_up(GemmEngine& gemm, cudaStream_t stream, const bf16* x, int64_t rows,
                          const bf16* w_gate_up, const bf16* dgu, void* g_gate_up, bool g_f32,
                          float beta, bf16* dx, int64_t hidden, int64_t ffn) {
  const int64_t H = hidden, F = ffn;
  if (rows == 0) return;
  gemm.run(stream, true, false, H, 2 * F, rows, x, dgu, g_gate_up, g_f32, beta,
           true);                                                                 // dWgu = x^T dgu
  gemm.run(stream, false, true, rows, H, 2 * F, dgu, w_gate_up, dx, false, 0.f);  // dx = dgu Wgu^T
}

void expert_ffn_backward(GemmEngine& gemm, cudaStream_t stream, const bf16* x, int64_t rows,
                         const bf16* w_gate_up, const bf16* w_down, const bf16* gu, const bf16* act,
                         const bf16* dy, void* g_gate_up, void* g_down, bool g_f32, float beta,
                         bf16* dx, bf16* dgu, bf16* dact, int64_t hidden, int64_t ffn) {
  ffn_backward_down(gemm, stream, rows, w_down, act, dy, g_gate_up, g_down, g_f32, beta, dact,
                    hidden, ffn);
  if (rows == 0) return;
  FEPLB_CUDA_CHECK(kernels::swiglu_backward(gu, dact, rows, ffn, dgu, stream));  // d gate|up
  ffn_backward_gate_up(gemm, stream, x, rows, w_gate_up, dgu, g_gate_up, g_f32, beta, dx, hidden,
                       ffn);
}

}  // namespace feplb::cuda
