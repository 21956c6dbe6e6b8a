#include "bench/harness/trainer.h"

#include <cmath>

#include "bench/harness/kernels/kernels.h"
#include "bench/harness/local_experts.h"
#include "bench/harness/rank_threads.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/gemm/expert_ffn.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/sim/workload.h"

namespace feplb::cuda {

TrainRouting routing_from_trace(const Trace& t, int micro_batches, int layers) {
  FEPLB_REQUIRE_INPUT(!t.steps.empty(), "training: the trace has no steps");
  TrainRouting r(static_cast<size_t>(micro_batches));
  for (int m = 0; m < micro_batches; ++m) {
    for (int l = 0; l < layers; ++l) {
      const RoutingStep& step = t.steps[static_cast<size_t>(m * layers + l) % t.steps.size()];
      std::vector<std::vector<int32_t>> ranks;
      for (int k = 0; k < t.num_ranks; ++k)
        ranks.push_back(topk_from_counts(step.row(k), t.tokens_per_rank, t.top_k));
      r[m].push_back(std::move(ranks));
    }
  }
  return r;
}

TrainResult run_virtual_training(const TrainConfig& cfg, const TrainRouting& routing) {
  const RuntimeConfig& rc = cfg.runtime;
  const int R = rc.topo.num_ranks(), L = cfg.layers, M = cfg.micro_batches;
  const int64_t S = rc.max_tokens, K = cfg.top_k, H = rc.shape.hidden, F = rc.shape.ffn;
  FEPLB_REQUIRE_INPUT(L >= 1 && M >= 1 && cfg.steps >= 1,
                      "training: {} layers, {} micro-batches, {} steps", L, M, cfg.steps);
  FEPLB_REQUIRE_INPUT(static_cast<int>(routing.size()) == M,
                      "training: routing for {} micro-batches, {} configured", routing.size(), M);
  for (const auto& mb : routing) {
    FEPLB_REQUIRE_INPUT(static_cast<int>(mb.size()) == L,
                        "training: routing for {} layers, {} configured", mb.size(), L);
    for (const auto& layer : mb) {
      FEPLB_REQUIRE_INPUT(static_cast<int>(layer.size()) == R,
                          "training: routing for {} ranks, {} configured", layer.size(), R);
      for (const auto& idx : layer) {
        FEPLB_REQUIRE_INPUT(static_cast<int64_t>(idx.size()) == S * K,
                            "training: routing of {} pairs, expected {}", idx.size(), S * K);
      }
    }
  }
  const int experts_per_rank = rc.topo.experts_per_rank();
  InProcessGroup group(R, rc.timeout_s);
  TrainResult result;
  result.loss.assign(static_cast<size_t>(cfg.steps), 0.0);
  result.step_ms.assign(static_cast<size_t>(cfg.steps), 0.0);
  std::vector<TrainResult> per(static_cast<size_t>(R));
  run_rank_threads(R, [&](int r) {
    TrainResult& me = per[r];
    me.loss.assign(static_cast<size_t>(cfg.steps), 0.0);
    me.step_ms.assign(static_cast<size_t>(cfg.steps), 0.0);
    RuntimeConfig c = rc;
    c.training = true;
    c.max_top_k = std::max<int>(c.max_top_k, static_cast<int>(K));
    c.name = "train";
    EpRuntime runtime(c, group.endpoint(r));
    std::vector<std::unique_ptr<MoeLayer>> layers;
    std::vector<std::unique_ptr<LocalExperts>> experts;
    for (int l = 0; l < L; ++l) {
      layers.push_back(std::make_unique<MoeLayer>(
          runtime, LayerConfig{static_cast<int>(K), "train.l" + std::to_string(l)},
          make_gpu_planner(runtime, cfg.policy)));
      experts.push_back(std::make_unique<LocalExperts>(experts_per_rank, H, F, /*grads=*/true));
    }
    me.workspace_bytes = runtime.workspace_bytes();
    Stream s;
    // Optimizer state per layer: fp32 master weights, Adam moments.
    std::vector<DeviceBuffer<float>> master, mom1, mom2;
    for (int l = 0; l < L; ++l) {
      LocalExperts& ex = *experts[l];
      const int64_t W = ex.weight_elems();
      FEPLB_CUDA_CHECK(kernels::fill_random(ex.weights(), static_cast<size_t>(W),
                                            cfg.seed * 1000 + 17 * l + r,
                                            1.0f / std::sqrt(static_cast<float>(H)), s.get()));
      master.emplace_back(static_cast<size_t>(W));
      mom1.emplace_back(static_cast<size_t>(W));
      mom2.emplace_back(static_cast<size_t>(W));
      FEPLB_CUDA_CHECK(kernels::bf16_to_f32(ex.weights(), master[l].get(), W, s.get()));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(mom1[l].get(), 0, mom1[l].bytes(), s.get()));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(mom2[l].get(), 0, mom2[l].bytes(), s.get()));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(ex.grads(), 0, ex.grad_bytes(), s.get()));
    }
    // Inputs, targets and routing per micro-batch; activations h_0..h_L; gradients.
    const size_t act = static_cast<size_t>(S * H);
    std::vector<DeviceBuffer<bf16>> x, target;
    std::vector<std::vector<DeviceBuffer<int32_t>>> idx(static_cast<size_t>(M));
    for (int m = 0; m < M; ++m) {
      x.emplace_back(act);
      target.emplace_back(act);
      FEPLB_CUDA_CHECK(
          kernels::fill_random(x[m].get(), act, cfg.seed * 7919 + 31 * m + r, 1.0f, s.get()));
      FEPLB_CUDA_CHECK(kernels::fill_random(target[m].get(), act, cfg.seed * 104729 + 31 * m + r,
                                            1.0f, s.get()));
      for (int l = 0; l < L; ++l) {
        idx[m].emplace_back(static_cast<size_t>(S * K));
        if (S > 0) {
          FEPLB_CUDA_CHECK(cudaMemcpyAsync(idx[m][l].get(), routing[m][l][r].data(),
                                           idx[m][l].bytes(), cudaMemcpyHostToDevice, s.get()));
        }
      }
    }
    std::vector<DeviceBuffer<bf16>> h;
    for (int l = 0; l <= L; ++l) h.emplace_back(act);
    DeviceBuffer<bf16> g(act), gx(act);
    DeviceBuffer<float> wt(static_cast<size_t>(S * K)), gw(static_cast<size_t>(S * K)), loss(1);
    const std::vector<float> w_host(static_cast<size_t>(S * K), 1.0f / static_cast<float>(K));
    if (S > 0)
      FEPLB_CUDA_CHECK(
          cudaMemcpyAsync(wt.get(), w_host.data(), wt.bytes(), cudaMemcpyHostToDevice, s.get()));
    Event t0(true), t1(true);
    kernels::AdamParams adam;
    adam.lr = cfg.lr;
    std::vector<MicroBatch> saved(static_cast<size_t>(L));
    for (int step = 0; step < cfg.steps; ++step) {
      FEPLB_CUDA_CHECK(cudaMemsetAsync(loss.get(), 0, sizeof(float), s.get()));
      t0.record(s.get());
      for (int m = 0; m < M; ++m) {
        FEPLB_CUDA_CHECK(cudaMemcpyAsync(h[0].get(), x[m].get(), act * sizeof(bf16),
                                         cudaMemcpyDeviceToDevice, s.get()));
        for (int l = 0; l < L; ++l) {
          if (cfg.prefetch) layers[l]->prefetch(experts[l]->params(), s.get());
          saved[l] = layers[l]->forward(experts[l]->params(), h[l].get(), idx[m][l].get(), wt.get(),
                                        S, h[l + 1].get(), s.get());
          FEPLB_CUDA_CHECK(
              kernels::add_bf16(h[l + 1].get(), h[l].get(), static_cast<int64_t>(act), s.get()));
          me.migrated_slices += saved[l].stats().guest_rows > 0 ? 1 : 0;
        }
        me.saved_bytes = std::max(me.saved_bytes, runtime.saved_bytes());
        FEPLB_CUDA_CHECK(kernels::mse_loss_grad(
            h[L].get(), target[m].get(), static_cast<int64_t>(act), g.get(), loss.get(), s.get()));
        for (int l = L - 1; l >= 0; --l) {
          layers[l]->backward(std::move(saved[l]), experts[l]->params(), g.get(), wt.get(),
                              gx.get(), gw.get(), experts[l]->grad_views(), GradMode::kAccumulate,
                              s.get());
          FEPLB_CUDA_CHECK(
              kernels::add_bf16(g.get(), gx.get(), static_cast<int64_t>(act), s.get()));
          me.weight_recopies += layers[l]->last_backward_stats().weight_recopies;
        }
        if (c.timing) {
          sync_with_timeout(s.get(), c.timeout_s, "training micro-batch");
          for (int l = 0; l < L; ++l) {
            me.fwd_wait_ms.push_back(layers[l]->last_forward_stats().wait_ms);
            me.bwd_wait_ms.push_back(layers[l]->last_backward_stats().wait_ms);
          }
        }
      }
      const double b1 = std::pow(adam.beta1, step + 1), b2 = std::pow(adam.beta2, step + 1);
      adam.bias1 = static_cast<float>(1 - b1);
      adam.bias2 = static_cast<float>(1 - b2);
      for (int l = 0; l < L; ++l) {
        LocalExperts& ex = *experts[l];
        layers[l]->sync_gradients(s.get());
        FEPLB_CUDA_CHECK(kernels::adam_step(master[l].get(), ex.grads(), mom1[l].get(),
                                            mom2[l].get(), ex.weights(), ex.weight_elems(), adam,
                                            s.get()));
        FEPLB_CUDA_CHECK(cudaMemsetAsync(ex.grads(), 0, ex.grad_bytes(), s.get()));
      }
      t1.record(s.get());
      float host_loss = 0;
      FEPLB_CUDA_CHECK(
          cudaMemcpyAsync(&host_loss, loss.get(), sizeof(float), cudaMemcpyDeviceToHost, s.get()));
      sync_with_timeout(s.get(), c.timeout_s, "training step");
      me.loss[step] = host_loss;
      me.step_ms[step] = elapsed_ms(t0, t1);
    }
  });
  for (const TrainResult& p : per) {
    for (int i = 0; i < cfg.steps; ++i) {
      result.loss[i] += p.loss[i];
      result.step_ms[i] = std::max(result.step_ms[i], p.step_ms[i]);
    }
    result.fwd_wait_ms.insert(result.fwd_wait_ms.end(), p.fwd_wait_ms.begin(), p.fwd_wait_ms.end());
    result.bwd_wait_ms.insert(result.bwd_wait_ms.end(), p.bwd_wait_ms.begin(), p.bwd_wait_ms.end());
    result.weight_recopies += p.weight_recopies;
    result.migrated_slices += p.migrated_slices;
  }
  result.workspace_bytes = per[0].workspace_bytes;
  result.saved_bytes = per[0].saved_bytes;
  return result;
}

}  // namespace feplb::cuda
