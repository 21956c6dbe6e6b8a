#include "gpu_test_util.h"

#include <exception>
#include <mutex>

#include "feplb/cuda/check.h"
#include "feplb/cuda/rank_threads.h"
#include "feplb/cuda/resources.h"
#include "feplb/cuda/trace_runner.h"

namespace feplb::testing {

// Virtual ranks need more hardware queues than the default 8 (see trace_runner.h); this runs
// before main, so before the first CUDA call.
const bool kConnectionsRequested = (cuda::request_stream_connections(), true);

namespace {

std::vector<float> download_bf16(const cuda::DeviceBuffer<__nv_bfloat16>& d) {
  std::vector<uint16_t> h(d.size());
  if (!h.empty()) FEPLB_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_float(h[i]);
  return out;
}

cuda::DeviceBuffer<__nv_bfloat16> upload_bf16(const std::vector<float>& v) {
  const auto h = to_bf16(v);
  cuda::DeviceBuffer<__nv_bfloat16> d(h.size());
  if (!h.empty()) FEPLB_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), d.bytes(), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
cuda::DeviceBuffer<T> upload(const std::vector<T>& v) {
  cuda::DeviceBuffer<T> d(v.size());
  if (!v.empty()) FEPLB_CUDA_CHECK(cudaMemcpy(d.get(), v.data(), d.bytes(), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

// This rank's experts' weights, in its local order: [experts_per_rank, 3HF].
std::vector<float> local_weights(const ReferenceMoe& experts, const Topology& topo, int rank) {
  std::vector<float> local;
  for (int e : topo.local_experts(rank)) {
    const float* w = experts.expert_weights(e);
    local.insert(local.end(), w, w + 3 * experts.hidden * experts.ffn);
  }
  return local;
}

std::vector<RankResult> run_layer(const cuda::LayerConfig& config, const ReferenceMoe& experts,
                                  const std::vector<RankInputs>& inputs, int forwards) {
  const int R = config.topo.num_ranks();
  cuda::InProcessGroup group(R, config.timeout_s);
  std::vector<RankResult> results(static_cast<size_t>(R));
  cuda::run_rank_threads(R, [&](int r) {
    cuda::MoeLayer layer(config, group.endpoint(r));
    cuda::Stream stream;
    const RankInputs& in = inputs[r];
    const int64_t S = in.tokens;
    const auto w = upload_bf16(local_weights(experts, config.topo, r));
    const auto x = upload_bf16(in.hidden);
    const auto idx = upload(in.topk_idx);
    const auto wt = upload(in.topk_weight);
    cuda::DeviceBuffer<__nv_bfloat16> out(x.size());
    layer.set_weights(w.get(), stream.get());
    for (int f = 0; f < forwards; ++f) {
      if (S > 0) FEPLB_CUDA_CHECK(cudaMemsetAsync(out.get(), 0xff, out.bytes(), stream.get()));  // NaN
      layer.forward(x.get(), idx.get(), wt.get(), S, out.get(), stream.get());
      cuda::sync_with_timeout(stream.get(), config.timeout_s, "test forward");
    }
    results[r].out = download_bf16(out);
    results[r].plan = layer.last_plan();
    results[r].stats = layer.last_stats();
  });
  return results;
}


std::vector<std::vector<BackwardResult>> run_layer_backward(const cuda::LayerConfig& config,
                                                            const ReferenceMoe& experts,
                                                            const std::vector<RankInputs>& inputs,
                                                            const std::vector<std::vector<float>>& grad_out,
                                                            int layers) {
  const int R = config.topo.num_ranks();
  cuda::InProcessGroup group(R, config.timeout_s);
  std::vector<std::vector<BackwardResult>> results(static_cast<size_t>(layers),
                                                   std::vector<BackwardResult>(static_cast<size_t>(R)));
  const int64_t H = config.shape.hidden, K = config.top_k;
  cuda::run_rank_threads(R, [&](int r) {
    cuda::ExpertSlotPool pool(group.endpoint(r), config.shape, static_cast<int>(config.knobs.max_num_dyn),
                              cuda::default_staging_slots(config.knobs), "test.pool");
    std::vector<std::unique_ptr<cuda::MoeLayer>> ls;
    for (int l = 0; l < layers; ++l) {
      cuda::LayerConfig c = config;
      c.training = true;
      c.pool = &pool;
      c.name = "test.l" + std::to_string(l);
      ls.push_back(std::make_unique<cuda::MoeLayer>(c, group.endpoint(r)));
    }
    cuda::Stream stream;
    const cudaStream_t s = stream.get();
    const RankInputs& in = inputs[r];
    const int64_t S = in.tokens;
    const std::vector<float> local = local_weights(experts, config.topo, r);
    const auto w = upload_bf16(local);
    const auto x = upload_bf16(in.hidden);
    const auto go = upload_bf16(grad_out[r]);
    const auto idx = upload(in.topk_idx);
    const auto wt = upload(in.topk_weight);
    std::vector<cuda::DeviceBuffer<__nv_bfloat16>> out, gx;
    std::vector<cuda::DeviceBuffer<float>> gw;
    for (int l = 0; l < layers; ++l) {
      out.emplace_back(static_cast<size_t>(S * H));
      gx.emplace_back(static_cast<size_t>(S * H));
      gw.emplace_back(static_cast<size_t>(S * K));
      ls[l]->set_weights(w.get(), s);
      ls[l]->zero_grad(s);
      FEPLB_CUDA_CHECK(cudaMemsetAsync(out[l].get(), 0xff, out[l].bytes(), s));  // NaN
      FEPLB_CUDA_CHECK(cudaMemsetAsync(gx[l].get(), 0xff, gx[l].bytes(), s));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(gw[l].get(), 0xff, gw[l].bytes(), s));
    }
    for (int l = 0; l < layers; ++l) ls[l]->forward(x.get(), idx.get(), wt.get(), S, out[l].get(), s);
    for (int l = layers - 1; l >= 0; --l) ls[l]->backward(go.get(), wt.get(), gx[l].get(), gw[l].get(), s);
    for (int l = 0; l < layers; ++l) ls[l]->sync_gradients(s);
    cuda::sync_with_timeout(s, config.timeout_s, "test backward");
    for (int l = 0; l < layers; ++l) {
      BackwardResult& res = results[l][r];
      res.out = download_bf16(out[l]);
      res.grad_hidden = download_bf16(gx[l]);
      res.grad_topk_weight.resize(gw[l].size());
      if (!res.grad_topk_weight.empty()) {
        FEPLB_CUDA_CHECK(cudaMemcpy(res.grad_topk_weight.data(), gw[l].get(), gw[l].bytes(), cudaMemcpyDeviceToHost));
      }
      res.main_grad.resize(local.size());
      FEPLB_CUDA_CHECK(cudaMemcpy(res.main_grad.data(), ls[l]->main_grad(), local.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost));
      res.plan = ls[l]->last_plan();
      res.stats = ls[l]->last_backward_stats();
    }
  });
  return results;
}

ErrorStats compare(const std::vector<float>& a, const std::vector<double>& ref) {
  ErrorStats s;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(a[i])) s.has_nan = true;
    const double d = a[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    s.max_abs = std::max(s.max_abs, std::abs(d));
    s.ref_max = std::max(s.ref_max, std::abs(ref[i]));
  }
  s.rel_l2 = s.has_nan ? INFINITY : (den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  return s;
}

}  // namespace feplb::testing
