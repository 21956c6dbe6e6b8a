// Helpers for GPU tests: skip without a GPU, random bf16 inputs, and running R virtual ranks
// of an EpRuntime and its MoeLayers (one thread each) on the current GPU.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness/reference_moe.h"
#include "feplb/core/bf16.h"
#include "feplb/core/rng.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/device.h"
#include "feplb/cuda/moe_layer.h"
#include "feplb/cuda/runtime.h"

namespace feplb::testing {

#define FEPLB_SKIP_WITHOUT_GPU()                                                  \
  do {                                                                            \
    std::string why_;                                                             \
    if (::feplb::list_devices(&why_).empty()) GTEST_SKIP() << "no GPU: " << why_; \
  } while (0)

// A rank's inputs: tokens routed top-k over experts with a skewed popularity.
struct RankInputs {
  int64_t tokens = 0;
  std::vector<float> hidden;       // [S, H] bf16-exact
  std::vector<int32_t> topk_idx;   // [S, K]
  std::vector<float> topk_weight;  // [S, K]
};

// Expert popularity: p_e ~ exp(skew * z_e). hot_expert >= 0 sends every token's first choice there.
inline RankInputs random_rank_inputs(Rng& rng, int64_t tokens, int64_t hidden, int experts,
                                     int top_k, const std::vector<double>& popularity,
                                     int hot_expert = -1) {
  RankInputs in;
  in.tokens = tokens;
  in.hidden.resize(static_cast<size_t>(tokens * hidden));
  for (float& x : in.hidden) x = round_to_bf16(static_cast<float>(rng.normal()));
  std::vector<double> cdf(popularity.size());
  double acc = 0;
  for (size_t e = 0; e < popularity.size(); ++e) cdf[e] = acc += popularity[e];
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int> chosen;
    if (hot_expert >= 0) chosen.push_back(hot_expert);
    while (static_cast<int>(chosen.size()) < top_k) {
      const double u = rng.uniform() * acc;
      int e = static_cast<int>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      e = std::min(e, experts - 1);
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    double wsum = 0;
    std::vector<double> w(static_cast<size_t>(top_k));
    for (double& x : w) wsum += x = 0.1 + rng.uniform();
    for (int k = 0; k < top_k; ++k) {
      in.topk_idx.push_back(chosen[k]);
      in.topk_weight.push_back(static_cast<float>(w[k] / wsum));
    }
  }
  return in;
}

inline ReferenceMoe random_experts(Rng& rng, int64_t hidden, int64_t ffn, int experts) {
  ReferenceMoe m{hidden, ffn, experts, {}};
  m.weights.resize(static_cast<size_t>(experts * 3 * hidden * ffn));
  const double scale_in = 1.0 / std::sqrt(static_cast<double>(hidden));
  const double scale_down = 1.0 / std::sqrt(static_cast<double>(ffn));
  for (int e = 0; e < experts; ++e) {
    float* w = m.weights.data() + e * 3 * hidden * ffn;
    for (int64_t i = 0; i < 2 * hidden * ffn; ++i)
      w[i] = round_to_bf16(static_cast<float>(rng.normal() * scale_in));
    for (int64_t i = 2 * hidden * ffn; i < 3 * hidden * ffn; ++i) {
      w[i] = round_to_bf16(static_cast<float>(rng.normal() * scale_down));
    }
  }
  return m;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
  return out;
}

// What the layer tests vary: the runtime's configuration, the policy and the layer's top_k; and
// weights before routing: prefetch() before every forward, after `warmup_forwards` forwards of
// `warmup_inputs` (empty: the inputs) per layer whose handles are dropped (the planner's history).
struct LayerSetup {
  cuda::RuntimeConfig runtime;
  std::string policy = "feplb";
  int top_k = 1;
  bool prefetch = false;
  bool bf16_grads = false;  // backward: weight gradients in bf16 (ExpertGrads' bf16 pair)
  int warmup_forwards = 0;
  std::vector<RankInputs> warmup_inputs;
};

struct RankResult {
  std::vector<float> out;  // [S, H]
  Plan plan;
  cuda::ForwardStats stats;
  std::vector<ModeTime> planner_times;  // its runtime's (EpRuntime::planner_times)
};

// Runs `setup` on R = topo ranks virtual ranks (one thread each) for `forwards` forwards of the
// same inputs, returning each rank's last output. Outputs are poisoned (NaN) before each forward.
std::vector<RankResult> run_layer(const LayerSetup& setup, const ReferenceMoe& experts,
                                  const std::vector<RankInputs>& inputs, int forwards = 1);

struct BackwardResult {
  std::vector<float> out, grad_hidden, grad_topk_weight;  // [S, H], [S, H], [S, K]
  std::vector<float> main_grad;  // [experts_per_rank, 3HF] this rank's experts' weight gradients
  Plan plan;
  cuda::BackwardStats stats;
  cuda::ForwardStats forward_stats;  // the micro-batch's forward
};

// `layers` layers (same experts, same inputs) on one runtime per rank: every layer's forward,
// then their backwards in reverse order with grad_out[rank] [S, H]. Results [layer][rank];
// outputs and gradients are NaN-poisoned first (with kAccumulate the weight gradients start at
// zero, with kOverwrite at NaN).
std::vector<std::vector<BackwardResult>> run_layer_backward(
    const LayerSetup& setup, const ReferenceMoe& experts, const std::vector<RankInputs>& inputs,
    const std::vector<std::vector<float>>& grad_out, int layers = 1,
    cuda::GradMode mode = cuda::GradMode::kAccumulate);

// One layer, micro-batches m = 0..M-1 with their own inputs [m][rank] and output gradients,
// run in the order `schedule` gives ("F0 F1 B0 F2 B1 B2": forward or backward of micro-batch m;
// "Pm": prefetch(), meant for micro-batch m's forward); the weight gradients accumulate over all
// of them. Results [m][rank]; main_grad (the sum) is in
// every micro-batch's entry.
std::vector<std::vector<BackwardResult>> run_schedule(
    const LayerSetup& setup, const ReferenceMoe& experts,
    const std::vector<std::vector<RankInputs>>& inputs,
    const std::vector<std::vector<std::vector<float>>>& grad_out, const std::string& schedule);

// Device buffers read back as floats.
std::vector<float> download_bf16(const cuda::DeviceBuffer<__nv_bfloat16>& d);
std::vector<float> download_f32(const float* d, size_t n);

// This rank's experts' weights, in its local order: [experts_per_rank, 3HF].
std::vector<float> local_weights(const ReferenceMoe& experts, const Topology& topo, int rank);

// Relative L2 error ||a - ref|| / ||ref|| (inf if a has a NaN), and the max abs error.
struct ErrorStats {
  double rel_l2 = 0, max_abs = 0, ref_max = 0;
  bool has_nan = false;
};
ErrorStats compare(const std::vector<float>& a, const std::vector<double>& ref);

}  // namespace feplb::testing
