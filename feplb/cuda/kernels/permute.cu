// Dispatch layout: count rows per expert, their offsets in send order, and the row scatter.
// Deterministic: within an expert, rows keep the order of their (token, k) pairs, whatever the
// order the GPU runs blocks in, so the weight gradients (sums over an expert's rows) come out
// bit for bit the same from run to run and from a replayed CUDA graph.
//
//   count:   one warp per chunk of `chunk` pairs: each pair's rank among the chunk's earlier pairs
//            of its expert (into pair_pos), the chunk's rows per expert, counts[e] += them
//   offsets: each expert's first send row, then each chunk's first row of every expert
//   scatter: one warp per pair: pair_pos = chunk's first row of its expert + rank; the row copied
#include "feplb/cuda/kernels/kernels.h"

namespace feplb::cuda::kernels {
namespace {

// Pairs per chunk: 256, more when there are more than kMaxChunks chunks of 256.
__host__ __device__ int64_t chunk_pairs(int64_t num_pairs) {
  const int64_t per = (num_pairs + kMaxChunks - 1) / kMaxChunks;
  return per <= 256 ? 256 : (per + 31) / 32 * 32;
}

// One warp per chunk. topk_idx: [P]; counts: [E + 1] (counts[E]: ids outside [0, E));
// chunk_rows: [chunks, E]; pair_pos: [P] = rank within the chunk's rows of its expert, -1 outside.
__global__ void count_kernel(const int32_t* __restrict__ topk_idx, int64_t num_pairs, int64_t chunk,
                             int num_experts, int32_t* __restrict__ counts,
                             int32_t* __restrict__ chunk_rows, int32_t* __restrict__ pair_pos) {
  extern __shared__ int32_t seen[];  // [E + 1]: the chunk's rows so far per expert
  const int lane = threadIdx.x;
  for (int e = lane; e <= num_experts; e += 32) seen[e] = 0;
  __syncwarp();
  const int64_t lo = blockIdx.x * chunk, hi = min(lo + chunk, num_pairs);
  for (int64_t base = lo; base < hi; base += 32) {
    const int64_t i = base + lane;
    const int32_t id = i < hi ? topk_idx[i] : 0;
    // e: the expert, E for an id outside [0, E) (counted apart), -1 past the chunk's end
    const int e = i >= hi ? -1 : (id >= 0 && id < num_experts ? id : num_experts);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int earlier = __popc(peers & ((1u << lane) - 1u));
    const int32_t before = e >= 0 ? seen[e] : 0;
    __syncwarp();
    if (e >= 0 && earlier == 0) seen[e] = before + __popc(peers);
    __syncwarp();
    if (i < hi) pair_pos[i] = e < num_experts ? before + earlier : -1;
  }
  for (int e = lane; e <= num_experts; e += 32) {
    const int32_t n = seen[e];
    if (e < num_experts) chunk_rows[blockIdx.x * static_cast<int64_t>(num_experts) + e] = n;
    if (n) atomicAdd(&counts[e], n);  // integer sums: the same in any order
  }
}

// One block: each thread scans a contiguous run of the order, then the runs' totals are scanned;
// then each expert's column of chunk_rows becomes the chunks' first rows of it.
__global__ void offsets_kernel(const int32_t* __restrict__ counts,
                               const int32_t* __restrict__ order, int num_experts, int chunks,
                               int32_t* __restrict__ offsets, int32_t* __restrict__ chunk_rows) {
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
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    int32_t row = offsets[e];
#pragma unroll 8
    for (int c = 0; c < chunks; ++c) {
      int32_t& v = chunk_rows[c * static_cast<int64_t>(num_experts) + e];
      const int32_t n = v;
      v = row;
      row += n;
    }
  }
}

// One warp per (token, k) pair: its send row, then the token's hidden row copied in 16-byte words.
__global__ void scatter_kernel(const uint4* __restrict__ hidden,      // [S, H/8]
                               const int32_t* __restrict__ topk_idx,  // [S*K]
                               int64_t num_pairs, int64_t chunk, int top_k, int num_experts,
                               int64_t words_per_row,
                               const int32_t* __restrict__ chunk_rows,  // [chunks, E]
                               uint4* __restrict__ send,                // [S*K, H/8]
                               int32_t* __restrict__ pair_pos) {        // [S*K]
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t pair = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       pair < num_pairs; pair += warps) {
    int32_t pos = 0;
    if (lane == 0) {
      const int32_t rank = pair_pos[pair];
      pos = rank < 0 ? -1  // -1: out of range
                     : chunk_rows[(pair / chunk) * num_experts + topk_idx[pair]] + rank;
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

int chunks_of(int64_t num_pairs) {
  return static_cast<int>((num_pairs + chunk_pairs(num_pairs) - 1) / chunk_pairs(num_pairs));
}

}  // namespace

cudaError_t count_experts(const int32_t* topk_idx, int64_t num_pairs, int num_experts,
                          int32_t* counts, int32_t* chunk_rows, int32_t* pair_pos, cudaStream_t s) {
  if (num_pairs == 0) return cudaSuccess;
  if (num_experts > kMaxScatterExperts) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(num_experts + 1) * sizeof(int32_t);
  count_kernel<<<chunks_of(num_pairs), 32, smem, s>>>(topk_idx, num_pairs, chunk_pairs(num_pairs),
                                                      num_experts, counts, chunk_rows, pair_pos);
  return cudaGetLastError();
}

cudaError_t send_offsets(const int32_t* counts, const int32_t* order, int num_experts,
                         int64_t num_pairs, int32_t* offsets, int32_t* chunk_rows, cudaStream_t s) {
  const int chunks = num_pairs == 0 ? 0 : chunks_of(num_pairs);
  offsets_kernel<<<1, 1024, 0, s>>>(counts, order, num_experts, chunks, offsets, chunk_rows);
  return cudaGetLastError();
}

cudaError_t scatter_rows(const bf16* hidden, const int32_t* topk_idx, int64_t num_tokens, int top_k,
                         int num_experts, int64_t hidden_dim, const int32_t* chunk_rows, bf16* send,
                         int32_t* pair_pos, cudaStream_t s) {
  const int64_t pairs = num_tokens * top_k;
  if (pairs == 0) return cudaSuccess;
  scatter_kernel<<<grid_for(pairs * 32, 256), 256, 0, s>>>(
      reinterpret_cast<const uint4*>(hidden), topk_idx, pairs, chunk_pairs(pairs), top_k,
      num_experts, hidden_dim / 8, chunk_rows, reinterpret_cast<uint4*>(send), pair_pos);
  return cudaGetLastError();
}

cudaError_t load_permute_kernels() {
  return load_kernels({reinterpret_cast<const void*>(count_kernel),
                       reinterpret_cast<const void*>(offsets_kernel),
                       reinterpret_cast<const void*>(scatter_kernel)});
}

}  // namespace feplb::cuda::kernels
