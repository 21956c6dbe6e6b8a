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

namespace {

void check_routing(const TrainConfig& cfg, const TrainRouting& routing) {
  const RuntimeConfig& rc = cfg.runtime;
  const int R = rc.topo.num_ranks(), L = cfg.layers, M = cfg.micro_batches;
  const int64_t S = rc.max_tokens, K = cfg.top_k;
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
}

// One virtual rank's training: its runtime, layers and experts with their optimizer state (fp32
// master weights, Adam moments), its inputs, targets and routing per micro-batch, the activations
// h_0..h_L and the gradients; results into `me`.
class RankTraining {
 public:
  RankTraining(const TrainConfig& cfg, const TrainRouting& routing, Transport& transport, int r,
               TrainResult& me)
      : cfg_(cfg),
        c_(runtime_config(cfg)),
        r_(r),
        S_(cfg.runtime.max_tokens),
        K_(cfg.top_k),
        H_(cfg.runtime.shape.hidden),
        F_(cfg.runtime.shape.ffn),
        act_(static_cast<size_t>(S_ * H_)),
        runtime_(c_, transport),
        me_(me) {
    me_.loss.assign(static_cast<size_t>(cfg.steps), 0.0);
    me_.step_ms.assign(static_cast<size_t>(cfg.steps), 0.0);
    make_layers();
    me_.workspace_bytes = runtime_.workspace_bytes();
    make_inputs(routing);
  }

  void run() {
    Event t0(true), t1(true);
    for (int step = 0; step < cfg_.steps; ++step) {
      FEPLB_CUDA_CHECK(cudaMemsetAsync(loss_.get(), 0, sizeof(float), s_.get()));
      t0.record(s_.get());
      for (int m = 0; m < cfg_.micro_batches; ++m) micro_batch(m);
      adam_step(step);
      t1.record(s_.get());
      float host_loss = 0;
      FEPLB_CUDA_CHECK(cudaMemcpyAsync(&host_loss, loss_.get(), sizeof(float),
                                       cudaMemcpyDeviceToHost, s_.get()));
      sync_with_timeout(s_.get(), c_.timeout_s, "training step");
      me_.loss[step] = host_loss;
      me_.step_ms[step] = elapsed_ms(t0, t1);
    }
  }

 private:
  static RuntimeConfig runtime_config(const TrainConfig& cfg) {
    RuntimeConfig c = cfg.runtime;
    c.training = true;
    c.max_top_k = std::max<int>(c.max_top_k, cfg.top_k);
    c.name = "train";
    return c;
  }

  // The layers, their experts' weights (random) and optimizer state, gradients cleared.
  void make_layers() {
    const int experts_per_rank = c_.topo.experts_per_rank();
    for (int l = 0; l < cfg_.layers; ++l) {
      layers_.push_back(std::make_unique<MoeLayer>(
          runtime_, LayerConfig{static_cast<int>(K_), "train.l" + std::to_string(l)},
          make_gpu_planner(runtime_, cfg_.policy)));
      experts_.push_back(std::make_unique<LocalExperts>(experts_per_rank, H_, F_, /*grads=*/true));
      LocalExperts& ex = *experts_[l];
      const int64_t W = ex.weight_elems();
      FEPLB_CUDA_CHECK(kernels::fill_random(ex.weights(), static_cast<size_t>(W),
                                            cfg_.seed * 1000 + 17 * l + r_,
                                            1.0f / std::sqrt(static_cast<float>(H_)), s_.get()));
      master_.emplace_back(static_cast<size_t>(W));
      mom1_.emplace_back(static_cast<size_t>(W));
      mom2_.emplace_back(static_cast<size_t>(W));
      FEPLB_CUDA_CHECK(kernels::bf16_to_f32(ex.weights(), master_[l].get(), W, s_.get()));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(mom1_[l].get(), 0, mom1_[l].bytes(), s_.get()));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(mom2_[l].get(), 0, mom2_[l].bytes(), s_.get()));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(ex.grads(), 0, ex.grad_bytes(), s_.get()));
    }
    saved_.resize(static_cast<size_t>(cfg_.layers));
  }

  // Inputs, targets and routing per micro-batch; activations; gradients; top-k weights 1/K.
  void make_inputs(const TrainRouting& routing) {
    const int L = cfg_.layers;
    idx_.resize(static_cast<size_t>(cfg_.micro_batches));
    for (int m = 0; m < cfg_.micro_batches; ++m) {
      x_.emplace_back(act_);
      target_.emplace_back(act_);
      FEPLB_CUDA_CHECK(
          kernels::fill_random(x_[m].get(), act_, cfg_.seed * 7919 + 31 * m + r_, 1.0f, s_.get()));
      FEPLB_CUDA_CHECK(kernels::fill_random(target_[m].get(), act_,
                                            cfg_.seed * 104729 + 31 * m + r_, 1.0f, s_.get()));
      for (int l = 0; l < L; ++l) {
        idx_[m].emplace_back(static_cast<size_t>(S_ * K_));
        if (S_ > 0) {
          FEPLB_CUDA_CHECK(cudaMemcpyAsync(idx_[m][l].get(), routing[m][l][r_].data(),
                                           idx_[m][l].bytes(), cudaMemcpyHostToDevice, s_.get()));
        }
      }
    }
    for (int l = 0; l <= L; ++l) h_.emplace_back(act_);
    const std::vector<float> w_host(static_cast<size_t>(S_ * K_), 1.0f / static_cast<float>(K_));
    if (S_ > 0) {
      FEPLB_CUDA_CHECK(
          cudaMemcpyAsync(wt_.get(), w_host.data(), wt_.bytes(), cudaMemcpyHostToDevice, s_.get()));
      sync_with_timeout(s_.get(), c_.timeout_s, "training inputs");  // w_host goes out of scope
    }
  }

  // Forward through the layers (residual adds), the MSE loss, backward in reverse.
  void micro_batch(int m) {
    const int L = cfg_.layers;
    const auto n = static_cast<int64_t>(act_);
    FEPLB_CUDA_CHECK(cudaMemcpyAsync(h_[0].get(), x_[m].get(), act_ * sizeof(bf16),
                                     cudaMemcpyDeviceToDevice, s_.get()));
    for (int l = 0; l < L; ++l) {
      if (cfg_.prefetch) layers_[l]->prefetch(experts_[l]->params(), s_.get());
      saved_[l] = layers_[l]->forward(experts_[l]->params(), h_[l].get(), idx_[m][l].get(),
                                      wt_.get(), S_, h_[l + 1].get(), s_.get());
      FEPLB_CUDA_CHECK(kernels::add_bf16(h_[l + 1].get(), h_[l].get(), n, s_.get()));
      me_.migrated_slices += saved_[l].stats().guest_rows > 0 ? 1 : 0;
    }
    me_.saved_bytes = std::max(me_.saved_bytes, runtime_.saved_bytes());
    FEPLB_CUDA_CHECK(
        kernels::mse_loss_grad(h_[L].get(), target_[m].get(), n, g_.get(), loss_.get(), s_.get()));
    for (int l = L - 1; l >= 0; --l) {
      layers_[l]->backward(std::move(saved_[l]), experts_[l]->params(), g_.get(), wt_.get(),
                           gx_.get(), gw_.get(), experts_[l]->grad_views(), GradMode::kAccumulate,
                           s_.get());
      FEPLB_CUDA_CHECK(kernels::add_bf16(g_.get(), gx_.get(), n, s_.get()));
      me_.weight_recopies += layers_[l]->last_backward_stats().weight_recopies;
    }
    if (c_.timing) {
      sync_with_timeout(s_.get(), c_.timeout_s, "training micro-batch");
      for (int l = 0; l < L; ++l) {
        me_.fwd_wait_ms.push_back(layers_[l]->last_forward_stats().wait_ms);
        me_.bwd_wait_ms.push_back(layers_[l]->last_backward_stats().wait_ms);
      }
    }
  }

  // Adam on every layer's experts once their gradients are complete, then the gradients cleared.
  void adam_step(int step) {
    const double b1 = std::pow(adam_.beta1, step + 1), b2 = std::pow(adam_.beta2, step + 1);
    adam_.lr = cfg_.lr;
    adam_.bias1 = static_cast<float>(1 - b1);
    adam_.bias2 = static_cast<float>(1 - b2);
    for (int l = 0; l < cfg_.layers; ++l) {
      LocalExperts& ex = *experts_[l];
      layers_[l]->sync_gradients(s_.get());
      FEPLB_CUDA_CHECK(kernels::adam_step(master_[l].get(), ex.grads(), mom1_[l].get(),
                                          mom2_[l].get(), ex.weights(), ex.weight_elems(), adam_,
                                          s_.get()));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(ex.grads(), 0, ex.grad_bytes(), s_.get()));
    }
  }

  const TrainConfig& cfg_;
  const RuntimeConfig c_;
  const int r_;
  const int64_t S_, K_, H_, F_;
  const size_t act_;  // S * H
  EpRuntime runtime_;
  TrainResult& me_;
  Stream s_;
  std::vector<std::unique_ptr<MoeLayer>> layers_;
  std::vector<std::unique_ptr<LocalExperts>> experts_;
  std::vector<DeviceBuffer<float>> master_, mom1_, mom2_;
  std::vector<DeviceBuffer<bf16>> x_, target_, h_;
  std::vector<std::vector<DeviceBuffer<int32_t>>> idx_;
  DeviceBuffer<bf16> g_{act_}, gx_{act_};
  DeviceBuffer<float> wt_{static_cast<size_t>(S_ * K_)}, gw_{static_cast<size_t>(S_ * K_)},
      loss_{1};
  kernels::AdamParams adam_;
  std::vector<MicroBatch> saved_;
};

}  // namespace

TrainResult run_virtual_training(const TrainConfig& cfg, const TrainRouting& routing) {
  check_routing(cfg, routing);
  const int R = cfg.runtime.topo.num_ranks();
  InProcessGroup group(R, cfg.runtime.timeout_s);
  std::vector<TrainResult> per(static_cast<size_t>(R));
  run_rank_threads(R,
                   [&](int r) { RankTraining(cfg, routing, group.endpoint(r), r, per[r]).run(); });
  TrainResult result;
  result.loss.assign(static_cast<size_t>(cfg.steps), 0.0);
  result.step_ms.assign(static_cast<size_t>(cfg.steps), 0.0);
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
