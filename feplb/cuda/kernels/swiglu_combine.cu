// Elementwise expert activation (SwiGLU) and the weighted combine back to token order.
#include "feplb/cuda/kernels/kernels.h"

namespace feplb::cuda::kernels {
namespace {

// 8 outputs per thread: gu row = [gate (F) | up (F)], act = silu(gate) * up.
__global__ void swiglu_kernel(const uint4* __restrict__ gu,  // [rows, 2F/8]
                              int64_t rows, int64_t words,   // words = F/8
                              uint4* __restrict__ act) {     // [rows, F/8]
  const int64_t n = rows * words;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / words, w = i % words;
    const uint4 g4 = gu[r * 2 * words + w], u4 = gu[r * 2 * words + words + w];
    const bf16* g = reinterpret_cast<const bf16*>(&g4);
    const bf16* u = reinterpret_cast<const bf16*>(&u4);
    uint4 out;
    bf16* o = reinterpret_cast<bf16*>(&out);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float gf = __bfloat162float(g[j]);
      o[j] = __float2bfloat16(gf / (1.0f + __expf(-gf)) * __bfloat162float(u[j]));
    }
    act[i] = out;
  }
}

// One block per token; each thread owns 8 consecutive hidden values.
__global__ void combine_kernel(const uint4* __restrict__ y,           // [S*K, H/8]
                               const int32_t* __restrict__ pair_pos,  // [S*K]
                               const float* __restrict__ w,           // [S*K]
                               int top_k, int64_t words,              // words = H/8
                               uint4* __restrict__ out) {             // [S, H/8]
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < words; c += blockDim.x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < top_k; ++k) {
      const int64_t row = pair_pos[t * top_k + k];
      if (row < 0) continue;  // an expert id out of range: no row (the layer reports it)
      const float wk = w ? w[t * top_k + k] : 1.0f;
      const uint4 v4 = y[row * words + c];
      const bf16* v = reinterpret_cast<const bf16*>(&v4);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += wk * __bfloat162float(v[j]);
    }
    uint4 o4;
    bf16* o = reinterpret_cast<bf16*>(&o4);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = __float2bfloat16(acc[j]);
    out[t * words + c] = o4;
  }
}

}  // namespace

cudaError_t swiglu(const bf16* gu, int64_t rows, int64_t ffn, bf16* act, cudaStream_t s) {
  const int64_t n = rows * (ffn / 8);
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + 255) / 256;
  swiglu_kernel<<<static_cast<int>(blocks > 8192 ? 8192 : blocks), 256, 0, s>>>(
      reinterpret_cast<const uint4*>(gu), rows, ffn / 8, reinterpret_cast<uint4*>(act));
  return cudaGetLastError();
}

cudaError_t combine(const bf16* y, const int32_t* pair_pos, const float* topk_weight,
                    int64_t num_tokens, int top_k, int64_t hidden_dim, bf16* out, cudaStream_t s) {
  if (num_tokens == 0) return cudaSuccess;
  const int64_t words = hidden_dim / 8;
  const int threads = static_cast<int>(words < 256 ? ((words + 31) / 32) * 32 : 256);
  combine_kernel<<<static_cast<unsigned>(num_tokens), threads, 0, s>>>(
      reinterpret_cast<const uint4*>(y), pair_pos, topk_weight, top_k, words,
      reinterpret_cast<uint4*>(out));
  return cudaGetLastError();
}

cudaError_t load_swiglu_combine_kernels() {
  return load_kernels({reinterpret_cast<const void*>(swiglu_kernel),
                       reinterpret_cast<const void*>(combine_kernel)});
}

}  // namespace feplb::cuda::kernels
