// Reproducible random bf16 data on the device (tests and benchmarks).
#include "bench/harness/kernels/kernels.h"

namespace feplb::cuda::kernels {
namespace {

__device__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

__global__ void fill_kernel(bf16* __restrict__ x, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ULL + i);
    const float u = static_cast<float>(h >> 40) * (1.0f / 8388608.0f) - 1.0f;  // 24 bits -> [-1, 1)
    x[i] = __float2bfloat16(scale * u);
  }
}

}  // namespace

cudaError_t fill_random(bf16* x, size_t n, uint64_t seed, float scale, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  fill_kernel<<<4096, 256, 0, s>>>(x, n, seed, scale);
  return cudaGetLastError();
}

}  // namespace feplb::cuda::kernels
