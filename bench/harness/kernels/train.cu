// Device code of the harness's trainer (bench/harness/trainer.h): a residual add, a mean
// squared error loss, Adam on fp32 master weights, and bf16 -> fp32 widening.
#include "bench/harness/kernels/kernels.h"

namespace feplb::cuda::kernels {
namespace {

// Adam on fp32 master weights; the bf16 copy the layer computes with is written alongside.
__global__ void adam_kernel(float* __restrict__ master, const float* __restrict__ grad,
                            float* __restrict__ m, float* __restrict__ v,
                            bf16* __restrict__ weights, int64_t n, AdamParams a) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = grad[i];
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float w = master[i] - a.lr * ((mi / a.bias1) / (sqrtf(vi / a.bias2) + a.eps) +
                                        a.weight_decay * master[i]);
    master[i] = w;
    weights[i] = __float2bfloat16(w);
  }
}

// y[i] = bf16(y[i] + x[i])
__global__ void add_bf16_kernel(bf16* __restrict__ y, const bf16* __restrict__ x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + __bfloat162float(x[i]));
  }
}

// Mean squared error against a target: grad = (x - target) / n (bf16), *loss += sum (x-target)^2 /
// (2n).
__global__ void mse_kernel(const bf16* __restrict__ x, const bf16* __restrict__ target, int64_t n,
                           float inv_n, bf16* __restrict__ grad, float* __restrict__ loss) {
  float acc = 0.f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float d = __bfloat162float(x[i]) - __bfloat162float(target[i]);
    grad[i] = __float2bfloat16(d * inv_n);
    acc += d * d;
  }
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if ((threadIdx.x & 31) == 0) atomicAdd(loss, 0.5f * acc * inv_n);
}

__global__ void widen_kernel(const bf16* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = __bfloat162float(x[i]);
  }
}

int grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b > 8192 ? 8192 : (b < 1 ? 1 : b));
}

}  // namespace

cudaError_t add_bf16(bf16* y, const bf16* x, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  add_bf16_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, x, n);
  return cudaGetLastError();
}

cudaError_t adam_step(float* master, const float* grad, float* m, float* v, bf16* weights,
                      int64_t n, const AdamParams& a, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  adam_kernel<<<grid_for(n, 256), 256, 0, s>>>(master, grad, m, v, weights, n, a);
  return cudaGetLastError();
}

cudaError_t mse_loss_grad(const bf16* x, const bf16* target, int64_t n, bf16* grad, float* loss,
                          cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  mse_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, target, n, 1.0f / static_cast<float>(n), grad,
                                              loss);
  return cudaGetLastError();
}

cudaError_t bf16_to_f32(const bf16* x, float* y, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  widen_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, y, n);
  return cudaGetLastError();
}

}  // namespace feplb::cuda::kernels
