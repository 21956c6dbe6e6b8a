// Launchers of feplb's device code (the only __global__ functions live in this folder). Raw
// pointers and a stream in, the launch's cudaError_t out; no fmt, no feplb host types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace feplb::cuda::kernels {

using bf16 = __nv_bfloat16;

// counts[e] += number of (token, k) pairs routed to expert e.  topk_idx: [num_pairs]; counts: [E].
cudaError_t count_experts(const int32_t* topk_idx, int64_t num_pairs, int32_t* counts, cudaStream_t s);

// offsets[order[p]] = sum_{q < p} counts[order[q]]: where each expert's rows start in send order.
// counts, offsets: [E]; order: [E], a permutation (experts grouped by destination rank).
cudaError_t send_offsets(const int32_t* counts, const int32_t* order, int num_experts, int32_t* offsets,
                         cudaStream_t s);

// Copies each (token, k) pair's hidden row into send order and records where it went.
// hidden: [S, H]; topk_idx: [S, K]; offsets: [E]; cursor: [E] zeroed; send: [S*K, H];
// pair_pos: [S*K] = send row of pair (t, k). H must be a multiple of 8 (16-byte rows).
cudaError_t scatter_rows(const bf16* hidden, const int32_t* topk_idx, int64_t num_tokens, int top_k,
                         int64_t hidden_dim, const int32_t* offsets, int32_t* cursor, bf16* send,
                         int32_t* pair_pos, cudaStream_t s);

// act[r, f] = silu(gu[r, f]) * gu[r, F + f].  gu: [rows, 2F]; act: [rows, F]; F multiple of 8.
cudaError_t swiglu(const bf16* gu, int64_t rows, int64_t ffn, bf16* act, cudaStream_t s);

// out[t] = sum_k w[t, k] * y[pair_pos[t*K + k]] (fp32 accumulation); w null: all weights 1.
// y: [S*K, H]; pair_pos, w: [S, K]; out: [S, H]. H multiple of 8.
cudaError_t combine(const bf16* y, const int32_t* pair_pos, const float* topk_weight, int64_t num_tokens,
                    int top_k, int64_t hidden_dim, bf16* out, cudaStream_t s);

// Backward of the combine. dy[pair_pos[p]] = w[p] * grad_out[t] and dweight[p] =
// <grad_out[t], y[pair_pos[p]]> for every pair p = t*K + k.
// grad_out: [S, H]; pair_pos, w, dweight: [S, K]; y, dy: [S*K, H]. H multiple of 8.
cudaError_t scatter_grad(const bf16* grad_out, const int32_t* pair_pos, const float* topk_weight, const bf16* y,
                         int64_t num_tokens, int top_k, int64_t hidden_dim, bf16* dy, float* dweight,
                         cudaStream_t s);

// SwiGLU backward: dgu [rows, 2F] = [d gate | d up] from gu [rows, 2F] = [gate | up] and
// dact [rows, F] = dL/d(silu(gate) * up). dgu may be gu (in place). F multiple of 8.
cudaError_t swiglu_backward(const bf16* gu, const bf16* dact, int64_t rows, int64_t ffn, bf16* dgu, cudaStream_t s);

// y[i] += x[i] for i < n (fp32; gradient staging into the main gradient), and the bf16 version.
cudaError_t add_f32(float* y, const float* x, int64_t n, cudaStream_t s);
cudaError_t add_bf16(bf16* y, const bf16* x, int64_t n, cudaStream_t s);

// Adam (with decoupled weight decay) on fp32 master weights [n]; writes the bf16 copy too.
// bias1 = 1 - beta1^step, bias2 = 1 - beta2^step.
struct AdamParams {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f, bias1 = 1.f, bias2 = 1.f;
};
cudaError_t adam_step(float* master, const float* grad, float* m, float* v, bf16* weights, int64_t n,
                      const AdamParams& a, cudaStream_t s);

// y[i] = float(x[i]) for i < n (fp32 master weights from bf16 ones).
cudaError_t bf16_to_f32(const bf16* x, float* y, int64_t n, cudaStream_t s);

// grad = (x - target) / n and *loss += sum (x - target)^2 / (2 n). x, target, grad: [n].
cudaError_t mse_loss_grad(const bf16* x, const bf16* target, int64_t n, bf16* grad, float* loss, cudaStream_t s);

// An SM copy kernel on exactly `blocks` blocks (the SM transports' way to move data), copying
// `bytes` (multiple of 16) src -> dst. With gbps > 0 it paces itself to that rate (globaltimer),
// holding its SMs for the whole transfer, as a persistent dispatch kernel does.
cudaError_t sm_copy(const void* src, void* dst, size_t bytes, int blocks, double gbps, cudaStream_t s);

// The SM hog: `blocks` blocks of 1024 threads with `smem_bytes` shared memory each spin until
// *stop != 0 or `spin_ns` elapse. With one block per SM and all shared memory, nothing else
// can run on any SM meanwhile. Call hog_max_smem() once to allow the large shared memory.
cudaError_t sm_hog(int blocks, int64_t spin_ns, const int* stop, size_t smem_bytes, cudaStream_t s);
cudaError_t hog_max_smem(size_t smem_bytes);

// One thread that spins `ns` nanoseconds on the GPU: a stream-ordered delay (benchmarks).
cudaError_t gpu_delay(int64_t ns, cudaStream_t s);

}  // namespace feplb::cuda::kernels

namespace feplb::cuda::kernels {

// x[i] = bf16(scale * u), u uniform in [-1, 1) from a hash of (seed, i): random, reproducible
// test and benchmark data without a host round trip (never time on zeros).  x: [n]
cudaError_t fill_random(bf16* x, size_t n, uint64_t seed, float scale, cudaStream_t s);

}  // namespace feplb::cuda::kernels
