// Launchers of feplb's device code (the only __global__ functions live in this folder). Raw
// pointers and a stream in, the launch's cudaError_t out; no fmt, no feplb host types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace feplb::cuda::kernels {

using bf16 = __nv_bfloat16;

// The dispatch layout in three kernels, deterministic: an expert's rows keep the order of their
// (token, k) pairs. The pairs are counted in chunks (at most kMaxChunks of them);
// chunk_rows: [kMaxChunks, E] workspace, written by count_experts, read by scatter_rows.
inline constexpr int kMaxChunks = 256;
inline constexpr int kMaxScatterExperts =
    8192;  // count_experts keeps E + 1 counters in shared memory

// counts[e] += number of (token, k) pairs routed to expert e, and counts[E] += those whose id is
// outside [0, E); each pair's rank among its chunk's earlier pairs of its expert into pair_pos (-1
// outside [0, E)), each chunk's rows per expert into chunk_rows. topk_idx, pair_pos: [num_pairs];
// counts: [E + 1], zeroed. cudaErrorInvalidValue for E > kMaxScatterExperts.
cudaError_t count_experts(const int32_t* topk_idx, int64_t num_pairs, int num_experts,
                          int32_t* counts, int32_t* chunk_rows, int32_t* pair_pos, cudaStream_t s);

// offsets[order[p]] = sum_{q < p} counts[order[q]]: where each expert's rows start in send order;
// then chunk_rows[c, e] = offsets[e] + the rows of e in chunks before c (for num_pairs pairs).
// counts, offsets: [E]; order: [E], a permutation (experts grouped by destination rank).
cudaError_t send_offsets(const int32_t* counts, const int32_t* order, int num_experts,
                         int64_t num_pairs, int32_t* offsets, int32_t* chunk_rows, cudaStream_t s);

// Copies each (token, k) pair's hidden row into send order and records where it went.
// hidden: [S, H]; topk_idx: [S, K]; chunk_rows from send_offsets; send: [S*K, H];
// pair_pos: [S*K], from count_experts, becomes the send row of pair (t, k), -1 for an expert id
// outside [0, E) (not copied). H must be a multiple of 8 (16-byte rows).
cudaError_t scatter_rows(const bf16* hidden, const int32_t* topk_idx, int64_t num_tokens, int top_k,
                         int num_experts, int64_t hidden_dim, const int32_t* chunk_rows, bf16* send,
                         int32_t* pair_pos, cudaStream_t s);

// act[r, f] = silu(gu[r, f]) * gu[r, F + f].  gu: [rows, 2F]; act: [rows, F]; F multiple of 8.
cudaError_t swiglu(const bf16* gu, int64_t rows, int64_t ffn, bf16* act, cudaStream_t s);

// out[t] = sum_k w[t, k] * y[pair_pos[t*K + k]] (fp32 accumulation); w null: all weights 1;
// pairs with pair_pos -1 add nothing. y: [S*K, H]; pair_pos, w: [S, K]; out: [S, H]. H multiple
// of 8.
cudaError_t combine(const bf16* y, const int32_t* pair_pos, const float* topk_weight,
                    int64_t num_tokens, int top_k, int64_t hidden_dim, bf16* out, cudaStream_t s);

// Backward of the combine. dy[pair_pos[p]] = w[p] * grad_out[t] and dweight[p] =
// <grad_out[t], y[pair_pos[p]]> for every pair p = t*K + k (pair_pos -1: no dy, dweight 0).
// grad_out: [S, H]; pair_pos, w, dweight: [S, K]; y, dy: [S*K, H]. H multiple of 8.
cudaError_t scatter_grad(const bf16* grad_out, const int32_t* pair_pos, const float* topk_weight,
                         const bf16* y, int64_t num_tokens, int top_k, int64_t hidden_dim, bf16* dy,
                         float* dweight, cudaStream_t s);

// SwiGLU backward: dgu [rows, 2F] = [d gate | d up] from gu [rows, 2F] = [gate | up] and
// dact [rows, F] = dL/d(silu(gate) * up). dgu may be gu (in place). F multiple of 8.
cudaError_t swiglu_backward(const bf16* gu, const bf16* dact, int64_t rows, int64_t ffn, bf16* dgu,
                            cudaStream_t s);

// y[i] += x[i] for i < n (fp32; staged weight gradients into the caller's gradient).
cudaError_t add_f32(float* y, const float* x, int64_t n, cudaStream_t s);
// y[i] = bf16(y[i] + x[i]) for i < n (fp32 sum; staged weight gradients into a bf16 gradient).
cudaError_t add_f32_to_bf16(bf16* y, const float* x, int64_t n, cudaStream_t s);

// Loading. CUDA loads a kernel lazily, at its first launch or attribute query, and a load waits
// for the whole device: a first launch while another stream waits (stream memory wait) for work
// this thread enqueues later never returns. A thread whose work such a wait depends on (the
// runtime's call thread, RuntimeConfig::call_thread) loads every kernel first. Each returns the
// first failure.
cudaError_t load_all();  // every kernel of this folder, the grouped GEMMs' where built
inline cudaError_t load_kernels(std::initializer_list<const void*> kernels) {
  for (const void* k : kernels) {
    cudaFuncAttributes a{};
    if (const cudaError_t e = cudaFuncGetAttributes(&a, k); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
cudaError_t load_permute_kernels();
cudaError_t load_swiglu_combine_kernels();
cudaError_t load_backward_kernels();
cudaError_t load_ffn_tables_kernels();
cudaError_t load_grouped_gemm_nn_kernels();
cudaError_t load_grouped_gemm_nt_kernels();
cudaError_t load_grouped_gemm_tn_kernels();

}  // namespace feplb::cuda::kernels
