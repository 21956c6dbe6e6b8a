// Kernels that hold SMs on purpose: an SM copy (the SM transports' data path, optionally paced)
// and the SM hog used to prove that the copy-engine path needs no SM.
#include "bench/harness/kernels/kernels.h"

namespace feplb::cuda::kernels {
namespace {

__device__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Each block copies its 1/gridDim share in 64 KiB chunks; paced blocks wait until the chunk's
// scheduled start (start + bytes_so_far / rate), spinning on their SM meanwhile.
__global__ void sm_copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                               int64_t words, double ns_per_word_per_block) {
  constexpr int64_t kChunk = 4096;  // words (64 KiB)
  __shared__ uint64_t start;
  if (threadIdx.x == 0) start = globaltimer_ns();
  __syncthreads();
  const int64_t per_block = (words + gridDim.x - 1) / gridDim.x;
  const int64_t lo = blockIdx.x * per_block, hi = min(lo + per_block, words);
  for (int64_t c = lo; c < hi; c += kChunk) {
    if (ns_per_word_per_block > 0) {
      const uint64_t due =
          start + static_cast<uint64_t>(static_cast<double>(c - lo) * ns_per_word_per_block);
      if (threadIdx.x == 0) {
        while (globaltimer_ns() < due) {
        }
      }
      __syncthreads();
    }
    const int64_t end = min(c + kChunk, hi);
    for (int64_t i = c + threadIdx.x; i < end; i += blockDim.x) dst[i] = src[i];
  }
}

__global__ void hog_kernel(int64_t spin_ns, const int* stop) {
  extern __shared__ char smem[];
  smem[threadIdx.x] = 0;
  const uint64_t t0 = globaltimer_ns();
  while (globaltimer_ns() - t0 < static_cast<uint64_t>(spin_ns)) {
    if (*reinterpret_cast<const volatile int*>(stop)) break;
  }
}

__global__ void delay_kernel(int64_t ns) {
  const uint64_t t0 = globaltimer_ns();
  while (globaltimer_ns() - t0 < static_cast<uint64_t>(ns)) {
  }
}

}  // namespace

cudaError_t gpu_delay(int64_t ns, cudaStream_t s) {
  delay_kernel<<<1, 1, 0, s>>>(ns);
  return cudaGetLastError();
}

cudaError_t sm_copy(const void* src, void* dst, size_t bytes, int blocks, double gbps,
                    cudaStream_t s) {
  const int64_t words = static_cast<int64_t>(bytes / 16);
  // Paced: each block moves words/blocks at gbps/blocks, i.e. one 16-byte word per this many ns.
  const double ns_per_word = gbps > 0 ? 16.0 / gbps * blocks : 0.0;
  sm_copy_kernel<<<blocks, 512, 0, s>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst),
                                        words, ns_per_word);
  return cudaGetLastError();
}

cudaError_t hog_max_smem(size_t smem_bytes) {
  return cudaFuncSetAttribute(hog_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem_bytes));
}

cudaError_t sm_hog(int blocks, int64_t spin_ns, const int* stop, size_t smem_bytes,
                   cudaStream_t s) {
  hog_kernel<<<blocks, 1024, smem_bytes, s>>>(spin_ns, stop);
  return cudaGetLastError();
}

}  // namespace feplb::cuda::kernels
