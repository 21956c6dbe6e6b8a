// Launchers of the harness's device code (tests, benchmarks, the trainer): not part of the
// runtime library. Raw pointers and a stream in, the launch's cudaError_t out.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace feplb::cuda::kernels {

using bf16 = __nv_bfloat16;

// y[i] = bf16(y[i] + x[i]) for i < n (the trainer's residual connection).
cudaError_t add_bf16(bf16* y, const bf16* x, int64_t n, cudaStream_t s);

// Adam (with decoupled weight decay) on fp32 master weights [n]; writes the bf16 copy too.
// bias1 = 1 - beta1^step, bias2 = 1 - beta2^step.
struct AdamParams {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f, bias1 = 1.f,
        bias2 = 1.f;
};
cudaError_t adam_step(float* master, const float* grad, float* m, float* v, bf16* weights,
                      int64_t n, const AdamParams& a, cudaStream_t s);

// y[i] = float(x[i]) for i < n (fp32 master weights from bf16 ones).
cudaError_t bf16_to_f32(const bf16* x, float* y, int64_t n, cudaStream_t s);

// grad = (x - target) / n and *loss += sum (x - target)^2 / (2 n). x, target, grad: [n].
cudaError_t mse_loss_grad(const bf16* x, const bf16* target, int64_t n, bf16* grad, float* loss,
                          cudaStream_t s);

// An SM copy kernel on exactly `blocks` blocks (the SM transports' way to move data), copying
// `bytes` (multiple of 16) src -> dst. With gbps > 0 it paces itself to that rate (globaltimer),
// holding its SMs for the whole transfer, as a persistent dispatch kernel does.
cudaError_t sm_copy(const void* src, void* dst, size_t bytes, int blocks, double gbps,
                    cudaStream_t s);

// The SM hog: `blocks` blocks of 1024 threads with `smem_bytes` shared memory each spin until
// *stop != 0 or `spin_ns` elapse. With one block per SM and all shared memory, nothing else
// can run on any SM meanwhile. Call hog_max_smem() once to allow the large shared memory.
cudaError_t sm_hog(int blocks, int64_t spin_ns, const int* stop, size_t smem_bytes, cudaStream_t s);
cudaError_t hog_max_smem(size_t smem_bytes);

// One thread that spins `ns` nanoseconds on the GPU: a stream-ordered delay (benchmarks).
cudaError_t gpu_delay(int64_t ns, cudaStream_t s);

// x[i] = bf16(scale * u), u uniform in [-1, 1) from a hash of (seed, i): random, reproducible
// test and benchmark data without a host round trip (never time on zeros).  x: [n]
cudaError_t fill_random(bf16* x, size_t n, uint64_t seed, float scale, cudaStream_t s);

}  // namespace feplb::cuda::kernels
