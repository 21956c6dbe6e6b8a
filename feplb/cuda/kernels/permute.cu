// Dispatch layout: count rows per expert, their offsets in send order, and the row scatter.
#include "feplb/cuda/kernels/kernels.h"

namespace feplb::cuda::kernels {
namespace {

// counts: [E + 1]; counts[E] counts the pairs whose expert id is outside [0, E).
__global__ void count_kernel(const int32_t* __restrict__ topk_idx, int64_t num_pairs,
                             int num_experts, int32_t* __restrict__ counts) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < num_pairs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = topk_idx[i];
    atomicAdd(&counts[e >= 0 && e < num_experts ? e : num_experts], 1);
  }
}

// One block: each thread scans a contiguous run of the order, then the runs' totals are scanned.
__global__ void offsets_kernel(const int32_t* __restrict__ counts,
                               const int32_t* __restrict__ order, int num_experts,
                               int32_t* __restrict__ offsets) {
  __shared__ int32_t run_total[1024];
  const int per = (num_experts + blockDim.x - 1) / blockDim.x;
  const int lo = threadIdx.x * per, hi = min(lo + per, num_experts);
  int32_t sum = 0;
  for (int p = lo; p < hi; ++p) sum += counts[order[p]];
  run_total[threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t acc = 0;
    for (int i = 0; i < blockDim.x; ++i) {
      const int32_t v = run_total[i];
      run_total[i] = acc;
      acc += v;
    }
  }
  __syncthreads();
  int32_t acc = run_total[threadIdx.x];
  for (int p = lo; p < hi; ++p) {
    offsets[order[p]] = acc;
    acc += counts[order[p]];
  }
}

// One warp per (token, k) pair: claim a send row, copy the token's hidden row in 16-byte words.
__global__ void scatter_kernel(const uint4* __restrict__ hidden,      // [S, H/8]
                               const int32_t* __restrict__ topk_idx,  // [S*K]
                               int64_t num_pairs, int top_k, int num_experts, int64_t words_per_row,
                               const int32_t* __restrict__ offsets, int32_t* __restrict__ cursor,
                               uint4* __restrict__ send,          // [S*K, H/8]
                               int32_t* __restrict__ pair_pos) {  // [S*K]
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t pair = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       pair < num_pairs; pair += warps) {
    int32_t pos = 0;
    if (lane == 0) {
      const int32_t e = topk_idx[pair];
      pos = e >= 0 && e < num_experts ? offsets[e] + atomicAdd(&cursor[e], 1)
                                      : -1;  // -1: out of range
      pair_pos[pair] = pos;
    }
    pos = __shfl_sync(0xffffffffu, pos, 0);
    if (pos < 0) continue;
    const uint4* src = hidden + (pair / top_k) * words_per_row;
    uint4* dst = send + static_cast<int64_t>(pos) * words_per_row;
    for (int64_t w = lane; w < words_per_row; w += 32) dst[w] = src[w];
  }
}

int grid_for(int64_t items, int per_block) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

}  // namespace

cudaError_t count_experts(const int32_t* topk_idx, int64_t num_pairs, int num_experts,
                          int32_t* counts, cudaStream_t s) {
  if (num_pairs == 0) return cudaSuccess;
  count_kernel<<<grid_for(num_pairs, 256), 256, 0, s>>>(topk_idx, num_pairs, num_experts, counts);
  return cudaGetLastError();
}

cudaError_t send_offsets(const int32_t* counts, const int32_t* order, int num_experts,
                         int32_t* offsets, cudaStream_t s) {
  offsets_kernel<<<1, 1024, 0, s>>>(counts, order, num_experts, offsets);
  return cudaGetLastError();
}

cudaError_t scatter_rows(const bf16* hidden, const int32_t* topk_idx, int64_t num_tokens, int top_k,
                         int num_experts, int64_t hidden_dim, const int32_t* offsets,
                         int32_t* cursor, bf16* send, int32_t* pair_pos, cudaStream_t s) {
  const int64_t pairs = num_tokens * top_k;
  if (pairs == 0) return cudaSuccess;
  scatter_kernel<<<grid_for(pairs * 32, 256), 256, 0, s>>>(
      reinterpret_cast<const uint4*>(hidden), topk_idx, pairs, top_k, num_experts, hidden_dim / 8,
      offsets, cursor, reinterpret_cast<uint4*>(send), pair_pos);
  return cudaGetLastError();
}

cudaError_t load_permute_kernels() {
  return load_kernels({reinterpret_cast<const void*>(count_kernel),
                       reinterpret_cast<const void*>(offsets_kernel),
                       reinterpret_cast<const void*>(scatter_kernel)});
}

}  // namespace feplb::cuda::kernels
