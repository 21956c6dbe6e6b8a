// One expert's SwiGLU FFN on the GPU with cuBLASLt (feplb/cuda/gemm.h): gu = x [gate|up], act = silu(gate) * up,
// y = act down. A per-expert cublasGemmEx loop measured 2.4x faster than cuBLAS's grouped GEMM
// on our H200 (FEPLB.md §8); bench/gpu re-measures both.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "feplb/cuda/gemm.h"

namespace feplb::cuda {

using bf16 = __nv_bfloat16;

// Elements of one expert's weights: [H, 2F] gate|up (row-major) then [F, H] down.
inline int64_t expert_weight_elems(int64_t hidden, int64_t ffn) { return 3 * hidden * ffn; }

// Row-major C [m, n] = A [m, k] * B [k, n] in bf16 with fp32 accumulation.
inline void gemm_bf16(GemmEngine& gemm, cudaStream_t stream, const bf16* a, const bf16* b, bf16* c, int64_t m,
                      int64_t n, int64_t k) {
  gemm.run(stream, false, false, m, n, k, a, b, c, false, 0.0f);
}

// y [rows, H] = FFN_w(x [rows, H]); gu [rows, 2F] and act [rows, F] are scratch. rows may be 0.
void expert_ffn(GemmEngine& gemm, cudaStream_t stream, const bf16* x, int64_t rows, const bf16* w,
                bf16* gu, bf16* act, bf16* y, int64_t hidden, int64_t ffn);

}  // namespace feplb::cuda

namespace feplb::cuda {

// The backward of expert_ffn for `rows` rows, given what the forward kept: x [rows, H],
// gu [rows, 2F] (gate|up before the activation), act [rows, F], and dy [rows, H]:
//   grad_w += dL/dw, laid out like w (fp32; beta 0 overwrites, 1 accumulates),
//   dx [rows, H] = dL/dx.
// Scratch: dact [rows, F] and dgu [rows, 2F]; they may be act and gu themselves (the layer
// overwrites its saved activations; benchmarks keep them). rows may be 0 (grad_w untouched when
// beta is 1, zeroed when it is 0).
void expert_ffn_backward(GemmEngine& gemm, cudaStream_t stream, const bf16* x, int64_t rows, const bf16* w,
                         const bf16* gu, const bf16* act, const bf16* dy, float* grad_w, float beta, bf16* dx,
                         bf16* dgu, bf16* dact, int64_t hidden, int64_t ffn);

}  // namespace feplb::cuda
