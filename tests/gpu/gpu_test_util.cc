#include "gpu_test_util.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>

#include "bench/harness/local_experts.h"
#include "bench/harness/rank_threads.h"
#include "bench/harness/trace_runner.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/resources.h"

namespace feplb::testing {

// Virtual ranks need more hardware queues than the default 8 (see trace_runner.h); this runs
// before main, so before the first CUDA call.
const bool kConnectionsRequested = (cuda::request_stream_connections(), true);

namespace {

cuda::DeviceBuffer<__nv_bfloat16> upload_bf16(const std::vector<float>& v) {
  const auto h = to_bf16(v);
  cuda::DeviceBuffer<__nv_bfloat16> d(h.size());
  if (!h.empty())
    FEPLB_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), d.bytes(), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
cuda::DeviceBuffer<T> upload(const std::vector<T>& v) {
  cuda::DeviceBuffer<T> d(v.size());
  if (!v.empty())
    FEPLB_CUDA_CHECK(cudaMemcpy(d.get(), v.data(), d.bytes(), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

std::vector<float> download_bf16(const cuda::DeviceBuffer<__nv_bfloat16>& d) {
  std::vector<uint16_t> h(d.size());
  if (!h.empty())
    FEPLB_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_float(h[i]);
  return out;
}

std::vector<float> download_f32(const float* d, size_t n) {
  std::vector<float> h(n);
  if (n) FEPLB_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// This rank's experts' weights, in its local order: [experts_per_rank, 3HF].
std::vector<float> local_weights(const ReferenceMoe& experts, const Topology& topo, int rank) {
  std::vector<float> local;
  for (int e : topo.local_experts(rank)) {
    const float* w = experts.expert_weights(e);
    local.insert(local.end(), w, w + 3 * experts.hidden * experts.ffn);
  }
  return local;
}

namespace {

// A rank's layer inputs on the GPU.
struct DeviceInputs {
  cuda::DeviceBuffer<__nv_bfloat16> x;
  cuda::DeviceBuffer<int32_t> idx;
  cuda::DeviceBuffer<float> wt;
  explicit DeviceInputs(const RankInputs& in)
      : x(upload_bf16(in.hidden)), idx(upload(in.topk_idx)), wt(upload(in.topk_weight)) {}
};

// The warm-up forwards' device buffers, kept until the rank's work is done: freeing device memory
// waits for the whole GPU, and with the runtime's call thread another virtual rank's queued calls
// then wait for calls this rank has not made yet (a deadlock).
struct WarmUpBuffers {
  std::unique_ptr<DeviceInputs> in;
  cuda::DeviceBuffer<__nv_bfloat16> out;
};

// The setup's warm-up forwards, layer by layer (with prefetch() first when the setup asks), of
// this rank's warm-up inputs (`inputs` when there are none); their handles are dropped.
WarmUpBuffers warm_up(const LayerSetup& setup, const std::vector<cuda::MoeLayer*>& layers,
                      const std::vector<std::span<const cuda::ExpertParams>>& weights,
                      const std::vector<RankInputs>& inputs, int rank, cudaStream_t s) {
  WarmUpBuffers kept;
  if (setup.warmup_forwards == 0) return kept;
  const RankInputs& in = setup.warmup_inputs.empty() ? inputs[rank] : setup.warmup_inputs[rank];
  kept.in = std::make_unique<DeviceInputs>(in);
  const DeviceInputs& d = *kept.in;
  kept.out = cuda::DeviceBuffer<__nv_bfloat16>(d.x.size());
  for (int f = 0; f < setup.warmup_forwards; ++f) {
    for (size_t l = 0; l < layers.size(); ++l) {
      if (setup.prefetch) layers[l]->prefetch(weights[l], s);
      cuda::MicroBatch dropped = layers[l]->forward(weights[l], d.x.get(), d.idx.get(), d.wt.get(),
                                                    in.tokens, kept.out.get(), s);
    }
  }
  cuda::sync_with_timeout(s, setup.runtime.timeout_s, "test warm-up forwards");
  return kept;
}

cuda::RuntimeConfig runtime_config(const LayerSetup& setup, bool training, const char* name) {
  cuda::RuntimeConfig c = setup.runtime;
  c.training = training;
  c.max_top_k = std::max(c.max_top_k, setup.top_k);
  c.name = name;
  return c;
}

}  // namespace

std::vector<RankResult> run_layer(const LayerSetup& setup, const ReferenceMoe& experts,
                                  const std::vector<RankInputs>& inputs, int forwards) {
  const cuda::RuntimeConfig config = runtime_config(setup, /*training=*/false, "test.fwd");
  const int R = config.topo.num_ranks();
  cuda::InProcessGroup group(R, config.timeout_s);
  std::vector<RankResult> results(static_cast<size_t>(R));
  cuda::run_rank_threads(R, [&](int r) {
    cuda::EpRuntime runtime(config, group.endpoint(r));
    cuda::MoeLayer layer(runtime, {setup.top_k, "test"},
                         cuda::make_gpu_planner(runtime, setup.policy));
    cuda::LocalExperts w(config.topo.experts_per_rank(), experts.hidden, experts.ffn,
                         /*grads=*/false);
    const auto w16 = to_bf16(local_weights(experts, config.topo, r));
    FEPLB_CUDA_CHECK(cudaMemcpy(w.weights(), w16.data(), w16.size() * 2, cudaMemcpyHostToDevice));
    cuda::Stream stream;
    const RankInputs& in = inputs[r];
    const int64_t S = in.tokens;
    const DeviceInputs d(in);
    cuda::DeviceBuffer<__nv_bfloat16> out(d.x.size());
    const WarmUpBuffers warmed = warm_up(setup, {&layer}, {w.params()}, inputs, r, stream.get());
    for (int f = 0; f < forwards; ++f) {
      if (S > 0)
        FEPLB_CUDA_CHECK(cudaMemsetAsync(out.get(), 0xff, out.bytes(), stream.get()));  // NaN
      if (setup.prefetch) layer.prefetch(w.params(), stream.get());
      layer.forward(w.params(), d.x.get(), d.idx.get(), d.wt.get(), S, out.get(), stream.get());
      cuda::sync_with_timeout(stream.get(), config.timeout_s, "test forward");
    }
    results[r].out = download_bf16(out);
    results[r].plan = layer.last_plan();
    results[r].stats = layer.last_forward_stats();
    const auto times = runtime.planner_times();
    results[r].planner_times.assign(times.begin(), times.end());
  });
  return results;
}

std::vector<std::vector<BackwardResult>> run_layer_backward(
    const LayerSetup& setup, const ReferenceMoe& experts, const std::vector<RankInputs>& inputs,
    const std::vector<std::vector<float>>& grad_out, int layers, cuda::GradMode mode) {
  const cuda::RuntimeConfig config = runtime_config(setup, /*training=*/true, "test.bwd");
  const int R = config.topo.num_ranks();
  cuda::InProcessGroup group(R, config.timeout_s);
  std::vector<std::vector<BackwardResult>> results(
      static_cast<size_t>(layers), std::vector<BackwardResult>(static_cast<size_t>(R)));
  const int64_t H = config.shape.hidden, K = setup.top_k;
  cuda::run_rank_threads(R, [&](int r) {
    cuda::EpRuntime runtime(config, group.endpoint(r));
    std::vector<std::unique_ptr<cuda::MoeLayer>> ls;
    std::vector<std::unique_ptr<cuda::LocalExperts>> ws;
    const std::vector<float> local = local_weights(experts, config.topo, r);
    const auto w16 = to_bf16(local);
    for (int l = 0; l < layers; ++l) {
      ls.push_back(std::make_unique<cuda::MoeLayer>(
          runtime, cuda::LayerConfig{setup.top_k, "test.l" + std::to_string(l)},
          cuda::make_gpu_planner(runtime, setup.policy)));
      ws.push_back(std::make_unique<cuda::LocalExperts>(config.topo.experts_per_rank(), H,
                                                        config.shape.ffn, true));
      FEPLB_CUDA_CHECK(
          cudaMemcpy(ws[l]->weights(), w16.data(), w16.size() * 2, cudaMemcpyHostToDevice));
      FEPLB_CUDA_CHECK(cudaMemset(ws[l]->grads(), mode == cuda::GradMode::kAccumulate ? 0 : 0xff,
                                  ws[l]->grad_bytes()));
    }
    // bf16 weight gradients (setup.bf16_grads), laid out as LocalExperts' fp32 ones; 0xffff: NaN.
    const int64_t elems = 3 * H * config.shape.ffn;
    const int64_t gate_up_elems = 2 * H * config.shape.ffn;
    const int E = config.topo.experts_per_rank();
    std::vector<cuda::DeviceBuffer<__nv_bfloat16>> g16;
    std::vector<std::vector<cuda::ExpertGrads>> g16_views(static_cast<size_t>(layers));
    for (int l = 0; setup.bf16_grads && l < layers; ++l) {
      g16.emplace_back(static_cast<size_t>(E * elems));
      FEPLB_CUDA_CHECK(
          cudaMemset(g16[l].get(), mode == cuda::GradMode::kAccumulate ? 0 : 0xff, g16[l].bytes()));
      for (int e = 0; e < E; ++e) {
        cuda::ExpertGrads v;
        v.gate_up_bf16 = g16[l].get() + e * elems;
        v.down_bf16 = v.gate_up_bf16 + gate_up_elems;
        g16_views[l].push_back(v);
      }
    }
    cuda::Stream stream;
    const cudaStream_t s = stream.get();
    const RankInputs& in = inputs[r];
    const int64_t S = in.tokens;
    const DeviceInputs d(in);
    const auto go = upload_bf16(grad_out[r]);
    std::vector<cuda::DeviceBuffer<__nv_bfloat16>> out, gx;
    std::vector<cuda::DeviceBuffer<float>> gw;
    for (int l = 0; l < layers; ++l) {
      out.emplace_back(static_cast<size_t>(S * H));
      gx.emplace_back(static_cast<size_t>(S * H));
      gw.emplace_back(static_cast<size_t>(S * K));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(out[l].get(), 0xff, out[l].bytes(), s));  // NaN
      FEPLB_CUDA_CHECK(cudaMemsetAsync(gx[l].get(), 0xff, gx[l].bytes(), s));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(gw[l].get(), 0xff, gw[l].bytes(), s));
    }
    std::vector<cuda::MoeLayer*> lp;
    std::vector<std::span<const cuda::ExpertParams>> wp;
    for (int l = 0; l < layers; ++l) {
      lp.push_back(ls[l].get());
      wp.push_back(ws[l]->params());
    }
    const WarmUpBuffers warmed = warm_up(setup, lp, wp, inputs, r, s);
    std::vector<cuda::MicroBatch> mbs;
    for (int l = 0; l < layers; ++l) {
      if (setup.prefetch) ls[l]->prefetch(ws[l]->params(), s);
      mbs.push_back(
          ls[l]->forward(ws[l]->params(), d.x.get(), d.idx.get(), d.wt.get(), S, out[l].get(), s));
      results[l][r].forward_stats = mbs.back().stats();
    }
    for (int l = layers - 1; l >= 0; --l) {
      const std::span<const cuda::ExpertGrads> grads =
          setup.bf16_grads ? std::span<const cuda::ExpertGrads>(g16_views[l]) : ws[l]->grad_views();
      ls[l]->backward(std::move(mbs[l]), ws[l]->params(), go.get(), d.wt.get(), gx[l].get(),
                      gw[l].get(), grads, mode, s);
    }
    for (int l = 0; l < layers; ++l) ls[l]->sync_gradients(s);
    cuda::sync_with_timeout(s, config.timeout_s, "test backward");
    for (int l = 0; l < layers; ++l) {
      BackwardResult& res = results[l][r];
      res.out = download_bf16(out[l]);
      res.grad_hidden = download_bf16(gx[l]);
      res.grad_topk_weight = download_f32(gw[l].get(), gw[l].size());
      res.main_grad =
          setup.bf16_grads ? download_bf16(g16[l]) : download_f32(ws[l]->grads(), local.size());
      res.plan = ls[l]->last_plan();
      res.stats = ls[l]->last_backward_stats();
    }
  });
  return results;
}

std::vector<std::vector<BackwardResult>> run_schedule(
    const LayerSetup& setup, const ReferenceMoe& experts,
    const std::vector<std::vector<RankInputs>>& inputs,
    const std::vector<std::vector<std::vector<float>>>& grad_out, const std::string& schedule) {
  const cuda::RuntimeConfig config = runtime_config(setup, /*training=*/true, "test.sched");
  const int R = config.topo.num_ranks();
  const int M = static_cast<int>(inputs.size());
  const int64_t H = config.shape.hidden, K = setup.top_k;
  cuda::InProcessGroup group(R, config.timeout_s);
  std::vector<std::vector<BackwardResult>> results(
      static_cast<size_t>(M), std::vector<BackwardResult>(static_cast<size_t>(R)));
  cuda::run_rank_threads(R, [&](int r) {
    cuda::EpRuntime runtime(config, group.endpoint(r));
    cuda::MoeLayer layer(runtime, {setup.top_k, "test.sched"},
                         cuda::make_gpu_planner(runtime, setup.policy));
    cuda::LocalExperts w(config.topo.experts_per_rank(), H, config.shape.ffn, true);
    const std::vector<float> local = local_weights(experts, config.topo, r);
    const auto w16 = to_bf16(local);
    FEPLB_CUDA_CHECK(cudaMemcpy(w.weights(), w16.data(), w16.size() * 2, cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(cudaMemset(w.grads(), 0, w.grad_bytes()));
    cuda::Stream stream;
    const cudaStream_t s = stream.get();
    std::vector<std::unique_ptr<DeviceInputs>> d;
    std::vector<cuda::DeviceBuffer<__nv_bfloat16>> out, gx, go;
    std::vector<cuda::DeviceBuffer<float>> gw;
    std::vector<cuda::MicroBatch> mbs(static_cast<size_t>(M));
    for (int m = 0; m < M; ++m) {
      const RankInputs& in = inputs[m][r];
      d.push_back(std::make_unique<DeviceInputs>(in));
      go.push_back(upload_bf16(grad_out[m][r]));
      out.emplace_back(static_cast<size_t>(in.tokens * H));
      gx.emplace_back(static_cast<size_t>(in.tokens * H));
      gw.emplace_back(static_cast<size_t>(in.tokens * K));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(out[m].get(), 0xff, out[m].bytes(), s));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(gx[m].get(), 0xff, gx[m].bytes(), s));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(gw[m].get(), 0xff, gw[m].bytes(), s));
    }
    for (size_t i = 0; i + 1 < schedule.size(); ++i) {
      const char op = schedule[i];
      if (op != 'F' && op != 'B' && op != 'P') continue;
      const int m = schedule[i + 1] - '0';
      FEPLB_CHECK(m >= 0 && m < M, "schedule '{}': micro-batch {}", schedule, m);
      if (op == 'P') {
        layer.prefetch(w.params(), s);
      } else if (op == 'F') {
        mbs[m] = layer.forward(w.params(), d[m]->x.get(), d[m]->idx.get(), d[m]->wt.get(),
                               inputs[m][r].tokens, out[m].get(), s);
        results[m][r].forward_stats = mbs[m].stats();
      } else {
        layer.backward(std::move(mbs[m]), w.params(), go[m].get(), d[m]->wt.get(), gx[m].get(),
                       gw[m].get(), w.grad_views(), cuda::GradMode::kAccumulate, s);
        results[m][r].stats = layer.last_backward_stats();
      }
    }
    layer.sync_gradients(s);
    cuda::sync_with_timeout(s, config.timeout_s, "test schedule");
    const auto main_grad = download_f32(w.grads(), local.size());
    for (int m = 0; m < M; ++m) {
      BackwardResult& res = results[m][r];
      res.out = download_bf16(out[m]);
      res.grad_hidden = download_bf16(gx[m]);
      res.grad_topk_weight = download_f32(gw[m].get(), gw[m].size());
      res.main_grad = main_grad;
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
