// Device code of the layer backward: the output gradient scattered to expert rows (and the
// router-weight gradient), SwiGLU's derivative, and the fp32 add of staged weight gradients.
#include "feplb/cuda/kernels/kernels.h"

namespace feplb::cuda::kernels {
namespace {

// One block per (token, k) pair p = t*K + k; each thread owns 8 consecutive hidden values.
//   dy[pair_pos[p]] = w[p] * grad_out[t]             (bf16, the expert output's gradient)
//   dw[p] = <grad_out[t], y[pair_pos[p]]>            (fp32 accumulation; block reduction)
__global__ void scatter_grad_kernel(const uint4* __restrict__ grad_out,    // [S, H/8]
                                    const int32_t* __restrict__ pair_pos,  // [S*K]
                                    const float* __restrict__ w,           // [S*K]
                                    const uint4* __restrict__ y,           // [S*K, H/8]
                                    int top_k, int64_t words,              // words = H/8
                                    uint4* __restrict__ dy,                // [S*K, H/8]
                                    float* __restrict__ dw) {              // [S*K]
  const int64_t p = blockIdx.x;
  const int64_t t = p / top_k;
  const int64_t row = pair_pos[p];
  if (row < 0) {  // an expert id out of range: no row (the layer reports it)
    if (threadIdx.x == 0) dw[p] = 0.f;
    return;
  }
  const float wk = w[p];
  float dot = 0.f;
  for (int64_t c = threadIdx.x; c < words; c += blockDim.x) {
    const uint4 g4 = grad_out[t * words + c], y4 = y[row * words + c];
    const bf16* g = reinterpret_cast<const bf16*>(&g4);
    const bf16* yv = reinterpret_cast<const bf16*>(&y4);
    uint4 o4;
    bf16* o = reinterpret_cast<bf16*>(&o4);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float gf = __bfloat162float(g[j]);
      dot += gf * __bfloat162float(yv[j]);
      o[j] = __float2bfloat16(wk * gf);
    }
    dy[row * words + c] = o4;
  }
  __shared__ float partial[32];
  for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = dot;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (unsigned i = 0; i < (blockDim.x + 31) / 32; ++i) s += partial[i];
    dw[p] = s;
  }
}

// 8 values per thread: gu row [g | u] and da (= d act) -> dgu row [dg | du] with
//   du = da * silu(g),  dg = da * u * silu'(g),  silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
// dgu may alias gu: each thread reads its g, u before writing dg, du in the same places.
__global__ void swiglu_backward_kernel(const uint4* gu,               // [rows, 2F/8]
                                       const uint4* __restrict__ da,  // [rows, F/8]
                                       int64_t rows, int64_t words,   // words = F/8
                                       uint4* dgu) {                  // [rows, 2F/8]
  const int64_t n = rows * words;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / words, c = i % words;
    const int64_t gi = r * 2 * words + c, ui = gi + words;
    const uint4 gin = gu[gi], uin = gu[ui], a4 = da[i];
    uint4 gout, uout;
    const bf16* g = reinterpret_cast<const bf16*>(&gin);
    const bf16* u = reinterpret_cast<const bf16*>(&uin);
    const bf16* a = reinterpret_cast<const bf16*>(&a4);
    bf16* dg = reinterpret_cast<bf16*>(&gout);
    bf16* du = reinterpret_cast<bf16*>(&uout);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float gf = __bfloat162float(g[j]), uf = __bfloat162float(u[j]),
                  af = __bfloat162float(a[j]);
      const float s = 1.0f / (1.0f + __expf(-gf));
      du[j] = __float2bfloat16(af * gf * s);
      dg[j] = __float2bfloat16(af * uf * s * (1.0f + gf * (1.0f - s)));
    }
    dgu[gi] = gout;
    dgu[ui] = uout;
  }
}

// y[i] += x[i]  (fp32)
__global__ void add_f32_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += x[i];
  }
}

// y[i] = bf16(y[i] + x[i])  (the sum in fp32)
__global__ void add_f32_to_bf16_kernel(bf16* __restrict__ y, const float* __restrict__ x,
                                       int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + x[i]);
  }
}

int grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b > 8192 ? 8192 : (b < 1 ? 1 : b));
}

}  // namespace

cudaError_t scatter_grad(const bf16* grad_out, const int32_t* pair_pos, const float* topk_weight,
                         const bf16* y, int64_t num_tokens, int top_k, int64_t hidden_dim, bf16* dy,
                         float* dweight, cudaStream_t s) {
  const int64_t pairs = num_tokens * top_k;
  if (pairs == 0) return cudaSuccess;
  const int64_t words = hidden_dim / 8;
  const int threads = static_cast<int>(words < 256 ? ((words + 31) / 32) * 32 : 256);
  scatter_grad_kernel<<<static_cast<unsigned>(pairs), threads, 0, s>>>(
      reinterpret_cast<const uint4*>(grad_out), pair_pos, topk_weight,
      reinterpret_cast<const uint4*>(y), top_k, words, reinterpret_cast<uint4*>(dy), dweight);
  return cudaGetLastError();
}

cudaError_t swiglu_backward(const bf16* gu, const bf16* dact, int64_t rows, int64_t ffn, bf16* dgu,
                            cudaStream_t s) {
  const int64_t n = rows * (ffn / 8);
  if (n == 0) return cudaSuccess;
  swiglu_backward_kernel<<<grid_for(n, 256), 256, 0, s>>>(
      reinterpret_cast<const uint4*>(gu), reinterpret_cast<const uint4*>(dact), rows, ffn / 8,
      reinterpret_cast<uint4*>(dgu));
  return cudaGetLastError();
}

cudaError_t add_f32(float* y, const float* x, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  add_f32_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, x, n);
  return cudaGetLastError();
}

cudaError_t add_f32_to_bf16(bf16* y, const float* x, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  add_f32_to_bf16_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, x, n);
  return cudaGetLastError();
}

cudaError_t load_backward_kernels() {
  return load_kernels({reinterpret_cast<const void*>(scatter_grad_kernel),
                       reinterpret_cast<const void*>(swiglu_backward_kernel),
                       reinterpret_cast<const void*>(add_f32_kernel),
                       reinterpret_cast<const void*>(add_f32_to_bf16_kernel)});
}

}  // namespace feplb::cuda::kernels
