// The lifecycle of feplb's GPU runtime, as docs/gpu.md shows it (the part between the [lifecycle]
// lines is copied there verbatim; tests/cli/gpu_doc_example.sh checks): create the transport and
// the rank's runtime, create the layers, forward, backward, destroy. One rank, two layers, on GPU
// 0; the weights, gradients and activations are the caller's (cudaMalloc here, a framework's
// tensors in a trainer). Exit status 0 when the outputs and gradients are finite and the weight
// gradients not all zero, 1 otherwise, 2 on an error, 77 without a GPU (nothing run).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "feplb/runtime.h"

namespace {

using feplb::cuda::bf16;
constexpr int kExperts = 8, kTopK = 2, kLayers = 2;
constexpr int64_t kHidden = 256, kFfn = 128, kTokens = 128;

template <typename T>
T* device_copy(const std::vector<T>& host) {
  void* p = nullptr;
  if (cudaMalloc(&p, host.size() * sizeof(T)) != cudaSuccess)
    throw feplb::Error("cudaMalloc failed");
  cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(p);
}

// One layer's experts as a framework holds them: bf16 weights and fp32 main gradients (zeroed).
struct Experts {
  std::vector<feplb::cuda::ExpertParams> params;
  std::vector<feplb::cuda::ExpertGrads> grads;
  float* grad_base = nullptr;
  explicit Experts(int seed) {
    const int64_t per_expert = 3 * kHidden * kFfn, gate_up = 2 * kHidden * kFfn;
    std::vector<bf16> w(static_cast<size_t>(kExperts * per_expert));
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = __float2bfloat16(0.02f * static_cast<float>((i * 7 + seed) % 11) - 0.1f);
    const bf16* wd = device_copy(w);
    grad_base = device_copy(std::vector<float>(w.size(), 0.0f));
    for (int e = 0; e < kExperts; ++e) {
      params.push_back({wd + e * per_expert, wd + e * per_expert + gate_up});
      grads.push_back({grad_base + e * per_expert, grad_base + e * per_expert + gate_up});
    }
  }
};

bool all_finite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("lifecycle: no GPU, nothing run\n");
    return 77;
  }
  try {
    using namespace feplb;
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    // Inputs of one micro-batch: hidden [S, H], routing [S, K] (ids, weights), grad_out [S, H].
    std::vector<bf16> x_h(kTokens * kHidden);
    for (size_t i = 0; i < x_h.size(); ++i)
      x_h[i] = __float2bfloat16(0.01f * static_cast<float>(i % 13));
    std::vector<int32_t> idx_h(kTokens * kTopK);
    for (int64_t t = 0; t < kTokens; ++t) {
      for (int k = 0; k < kTopK; ++k)
        idx_h[t * kTopK + k] = static_cast<int32_t>((t + 3 * k) % kExperts);
    }
    const bf16* x = device_copy(x_h);
    const bf16* dy = x;
    const int32_t* idx = device_copy(idx_h);
    const float* w = device_copy(std::vector<float>(kTokens * kTopK, 0.5f));
    bf16* y = device_copy(std::vector<bf16>(x_h.size()));
    bf16* dx = device_copy(std::vector<bf16>(x_h.size()));
    float* dw = device_copy(std::vector<float>(idx_h.size()));
    std::vector<Experts> experts;
    for (int l = 0; l < kLayers; ++l) experts.emplace_back(l);

    // [lifecycle]
    // 1. The rank's transport: one rank of this process here; in a training job, a transport over
    //    the framework's NCCL communicator, borrowed (docs/gpu.md, "Bootstrap").
    cuda::InProcessGroup group(/*world_size=*/1);
    // 2. One runtime per rank, alive for the job (collective: it registers peer buffers).
    cuda::RuntimeConfig config;
    config.topo = Topology::contiguous(/*num_ranks=*/1, /*gpus_per_node=*/8, kExperts);
    config.shape = {.hidden = kHidden, .ffn = kFfn};
    config.max_top_k = kTopK;
    config.max_tokens = kTokens;
    auto runtime = std::make_unique<cuda::EpRuntime>(config, group.endpoint(0));
    // 3. The layers, in the same order on every rank, each with its planner.
    std::vector<std::unique_ptr<cuda::MoeLayer>> layers;
    for (int l = 0; l < kLayers; ++l) {
      layers.push_back(std::make_unique<cuda::MoeLayer>(
          *runtime, cuda::LayerConfig{kTopK, "moe" + std::to_string(l)},
          cuda::make_gpu_planner(*runtime, "feplb")));
    }
    // 4. Forward: each layer returns the handle its backward consumes (several may be in flight).
    std::vector<cuda::MicroBatch> saved;
    for (int l = 0; l < kLayers; ++l) {
      saved.push_back(layers[l]->forward(experts[l].params, x, idx, w, kTokens, y, stream));
    }
    // 5. Backward, last layer first: dW added into the caller's fp32 gradients (main_grad).
    for (int l = kLayers - 1; l >= 0; --l) {
      layers[l]->backward(std::move(saved[l]), experts[l].params, dy, w, dx, dw, experts[l].grads,
                          cuda::GradMode::kAccumulate, stream);
      layers[l]->sync_gradients(stream);  // before an optimizer reads experts[l].grads
    }
    cudaStreamSynchronize(stream);
    // 6. Destroy in reverse: layers, then the runtime, then the transport (end of scope).
    layers.clear();
    runtime.reset();
    // [lifecycle]

    std::vector<float> got;
    std::vector<bf16> dx_h(x_h.size());
    cudaMemcpy(dx_h.data(), dx, dx_h.size() * sizeof(bf16), cudaMemcpyDeviceToHost);
    for (bf16 v : dx_h) got.push_back(__bfloat162float(v));
    std::vector<float> grads(static_cast<size_t>(kExperts * 3 * kHidden * kFfn));
    cudaMemcpy(grads.data(), experts[0].grad_base, grads.size() * sizeof(float),
               cudaMemcpyDeviceToHost);
    bool nonzero = false;
    for (float g : grads) nonzero = nonzero || g != 0.0f;
    const bool ok =
        all_finite(got) && all_finite(grads) && nonzero && cudaGetLastError() == cudaSuccess;
    std::printf(
        "lifecycle: %d layers forward + backward on one rank: %s\n", kLayers,
        ok ? "finite outputs, non-zero weight gradients" : "FAILED (non-finite or zero gradients)");
    return ok ? 0 : 1;
  } catch (const feplb::Error& e) {
    std::fprintf(stderr, "lifecycle: %s\n", e.what());
    return 2;
  }
}
