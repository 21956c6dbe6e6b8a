// Training a small MoE model on R virtual ranks of one GPU: `layers` MoE layers chained with
// residuals, h_{l+1} = h_l + moe_l(h_l), a mean-squared error against a fixed random target, and
// Adam on fp32 master weights (the layers compute with bf16 copies). Routing per (micro-batch,
// layer, rank) is given, from a trace or drawn at random. All layers of a rank share its
// EpRuntime; the trainer owns the weights, their fp32 gradients (accumulated, Megatron's main_grad
// convention) and the optimizer state, as a framework does. Used by the GPU tests (loss curves
// with balancing on and off) and the training-step benchmark.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "feplb/core/routing.h"
#include "feplb/cuda/moe_layer.h"
#include "feplb/cuda/runtime.h"

namespace feplb::cuda {

struct TrainConfig {
  RuntimeConfig runtime;  // topology, shape, max_tokens (= tokens per rank), knobs, timing
  std::string policy = "feplb";
  int top_k = 1;
  int layers = 2;
  int steps = 3;          // optimizer steps
  int micro_batches = 1;  // per step (gradients accumulate in the fp32 main gradient)
  float lr = 1e-3f;
  uint64_t seed = 1;
  bool prefetch =
      false;  // each layer's prefetch() right before its forward (planner knob prefetch = 1)
};

// [micro_batch][layer][rank] -> topk_idx [tokens * top_k]
using TrainRouting = std::vector<std::vector<std::vector<std::vector<int32_t>>>>;
// Routing of micro-batch m, layer l from trace step (m * layers + l) mod steps.
TrainRouting routing_from_trace(const Trace& trace, int micro_batches, int layers);

struct TrainResult {
  std::vector<double> loss;     // [step] summed over ranks and micro-batches
  std::vector<double> step_ms;  // [step] slowest rank (virtual ranks share the GPU)
  std::vector<double> fwd_wait_ms, bwd_wait_ms;  // per (step, micro-batch, layer, rank)
  int64_t weight_recopies = 0;  // guest weights copied again in backward (all ranks, steps)
  int64_t migrated_slices = 0;  // guest slices computed (all ranks, steps, forwards)
  size_t workspace_bytes = 0;   // one rank's runtime (arenas, slots, staging, scratch)
  size_t saved_bytes = 0;       // one rank's saved activations, all layers, one micro-batch
};

// Throws on a timeout (never hangs) and on bad configuration (InputError).
TrainResult run_virtual_training(const TrainConfig& config, const TrainRouting& routing);

}  // namespace feplb::cuda
