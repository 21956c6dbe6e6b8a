// MoeLayer: one MoE layer of a rank, forward and backward with FEPLB balancing, over a rank's
// EpRuntime. The layer holds its configuration, its planner (injected) and its last call's
// statistics; the experts' weights and gradients are the caller's, passed per call; everything a
// micro-batch keeps from forward to backward lives in the MicroBatch handle forward() returns,
// so several micro-batches may be in flight (pipeline schedules, recomputation).
//
// Forward, per rank (every rank derives the same plan from the same all-gathered counts):
//   permute + count -> counts all-gather -> counts to the host -> plan (scheduler thread)
//   phase 1: EP all-to-all-v to the experts' homes -> own experts' GEMMs (SMs)
//   phase 2 meanwhile: the scheduler issues copy-engine copies of migrated experts' weights and
//   rows into their helpers' arenas, each helper's batch ended by a signal (no SM); helpers run
//   their guests, outputs come back by copy engine; reverse all-to-all-v; weighted combine.
// Backward reuses the micro-batch's plan: dY rows to the helpers by copy engine (weights again
// only if another call refilled the slot), dX back by copy engine, dW (fp32) into the owner's
// staging slot, added into the caller's gradient off the critical path. Optimizer state never
// moves.
//
// Two opt-in paths, chosen by the feplb planner's knobs (docs/gpu.md):
//  * rows in one hop (one_hop = 1): migrated rows go straight to their helper in the phase-1
//    all-to-all-v and their outputs (backward: dX) come back in the reverse one; only the weights
//    (and dW) move by copy engine;
//  * weights before routing (prefetch = 1): prefetch() copies the predicted migrations' weights
//    into the helpers' guest slots ahead of the forward (e.g. before the attention block).
//
// Public header: CUDA runtime types only (no fmt, no cuBLAS).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "feplb/core/cost_model.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/routing.h"
#include "feplb/cuda/runtime.h"
#include "feplb/cuda/stats.h"

namespace feplb::cuda {

using bf16 = __nv_bfloat16;

// One local expert's weights, device memory the caller owns: gate|up [H, 2F] (the gate's F
// columns, then the up projection's) and down [F, H], row-major bf16.
struct ExpertParams {
  const bf16* gate_up = nullptr;
  const bf16* down = nullptr;
};

// One local expert's weight gradients, laid out like ExpertParams: fp32 (gate_up, down), or
// bf16, the parameters' own dtype (gate_up_bf16, down_bf16), which the dW GEMMs write themselves
// (no fp32 buffer, no cast pass; a slice computed on a helper adds its fp32 partial in with one
// rounding more). Set one pair, the same one for every expert of a call.
struct ExpertGrads {
  float* gate_up = nullptr;
  float* down = nullptr;
  bf16* gate_up_bf16 = nullptr;
  bf16* down_bf16 = nullptr;
  bool bf16_pair() const { return gate_up_bf16 != nullptr || down_bf16 != nullptr; }
};

enum class GradMode {
  kAccumulate,  // add into the caller's gradient (Megatron's main_grad convention)
  kOverwrite,   // write it (the expert's first dW GEMM at home writes with beta 0; an expert
                // without one is zeroed first)
};

struct LayerConfig {
  int top_k = 1;             // <= the runtime's max_top_k
  std::string name = "moe";  // for messages
};

// What one forward keeps for its backward (plan, layout, saved activations). Move-only. Given to
// backward() once; dropping it unused gives its memory back (stream-ordered on the forward's
// stream). Valid while its runtime lives.
class MicroBatch {
 public:
  MicroBatch() = default;
  ~MicroBatch();
  MicroBatch(MicroBatch&& other) noexcept;
  MicroBatch& operator=(MicroBatch&& other) noexcept;
  MicroBatch(const MicroBatch&) = delete;
  MicroBatch& operator=(const MicroBatch&) = delete;

  // Holds a forward's state that no backward has consumed.
  bool valid() const;
  const Plan& plan() const;
  const RoutingStep& routing() const;
  const ForwardStats& stats() const;  // GPU times need the stream to have finished
  size_t saved_bytes() const;
  int64_t num_tokens() const;

 private:
  friend class MoeLayer;
  size_t checked() const;  // the state's slot in the runtime; InputError when the handle is empty
  void release() noexcept;
  std::shared_ptr<EpRuntime::State> rt_;
  int slot_ = -1;
  uint64_t generation_ = 0;
};

// A planner by name for a layer of `runtime` (topology, shape and knobs from its configuration;
// prefetch_window_us = 0 becomes the attention block's time for the runtime's max_tokens, as in
// the simulator). InputError for a policy whose plans the GPU layer cannot run (rows kept at their
// source or on resident replicas: FasterMoE, EPLB, LLEP, MoonEP run in simulation only). `cost`
// (null: the roofline from the knobs) must outlive the planner.
std::unique_ptr<Planner> make_gpu_planner(const EpRuntime& runtime, std::string_view policy,
                                          const GemmCostModel* cost = nullptr);

class MoeLayer {
 public:
  // `planner` must promise plans the GPU layer runs (PlanLimits::rows_via_homes, or feplb's
  // one-hop plans). Layers of a runtime are constructed in the same order on every rank (they are
  // numbered by it).
  MoeLayer(EpRuntime& runtime, const LayerConfig& config, std::unique_ptr<Planner> planner);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // hidden [S, H], topk_idx [S, K] (global expert ids), topk_weight [S, K] -> out [S, H], with
  // `experts` this rank's experts' weights ([experts_per_rank], local order). Stream-ordered on
  // `stream`; every rank calls it for the same micro-batch. The returned handle (training
  // runtimes) carries what backward needs; forward-only runtimes return an empty one.
  // CUDA graphs: on a one-rank runtime whose forward counts its rows on the GPU (the grouped GEMMs
  // for its batch, no call thread), forward, backward and sync_gradients may be captured, a
  // micro-batch's forward and backward both or neither; at each replay the forward's row counts
  // reach last_routing() and last_plan() (settled by the layer's next call or reader). Any other
  // call on a capturing stream throws InputError before it enqueues anything.
  MicroBatch forward(std::span<const ExpertParams> experts, const bf16* hidden,
                     const int32_t* topk_idx, const float* topk_weight, int64_t num_tokens,
                     bf16* out, cudaStream_t stream);

  // grad_out [S, H] of micro-batch `mb` (this layer's; consumed) -> grad_hidden [S, H],
  // grad_topk_weight [S, K] fp32; this rank's experts' weight gradients into `grads` per `mode`
  // (helpers' contributions are added on a copy stream: sync_gradients() before reading them).
  void backward(MicroBatch&& mb, std::span<const ExpertParams> experts, const bf16* grad_out,
                const float* topk_weight, bf16* grad_hidden, float* grad_topk_weight,
                std::span<const ExpertGrads> grads, GradMode mode, cudaStream_t stream);

  // For a framework that dispatched the tokens itself (its own all-to-all, DeepEP): `rows`
  // [N, H] at this rank's experts, grouped by expert in local order, rows_per_expert[i] of local
  // expert i (host values, N = their sum) -> out_rows [N, H], each row's expert output (not yet
  // weighted, not combined). Phase 2 and the GEMMs only: the counts all-gather, the plan, the
  // copy-engine moves. The caller keeps `rows` unchanged until the backward. Collective.
  MicroBatch forward_dispatched(std::span<const ExpertParams> experts, const bf16* rows,
                                std::span<const int64_t> rows_per_expert, bf16* out_rows,
                                cudaStream_t stream);
  // grad_out_rows [N, H] (dL/d out_rows) -> grad_rows [N, H], weight gradients as backward().
  void backward_dispatched(MicroBatch&& mb, std::span<const ExpertParams> experts,
                           const bf16* grad_out_rows, bf16* grad_rows,
                           std::span<const ExpertGrads> grads, GradMode mode, cudaStream_t stream);

  // Weights before routing: asks the planner which (expert, helper) pairs this layer's next
  // forward is likely to migrate (Planner::prefetch; nothing unless its knob prefetch = 1) and
  // copies those weights from `experts` (this rank's, as forward takes them) into the helpers'
  // guest slots on the runtime's phase-2 copy stream: after `stream`'s prior work, each helper's
  // copies after its last use of its slots (no SM; the host may wait for a slower peer to have
  // issued that use). Returns at once. Call it ahead of the forward, e.g. before the attention
  // block, at the same point of every rank's call sequence. The runtime's next call settles it:
  // this layer's forward uses the prefetched weights (no second copy; a predicted pair the plan
  // does not use costs its bytes, never correctness; a migration that was not predicted is copied
  // as without prefetch); any other call (another layer, a backward, another prefetch) drops it.
  // `experts` must stay unchanged until then. A forward without a prefetch() runs as before.
  void prefetch(std::span<const ExpertParams> experts, cudaStream_t stream);

  // Later work on `stream` sees every weight gradient this layer's backwards produced.
  void sync_gradients(cudaStream_t stream);

  const LayerConfig& config() const;
  std::string_view policy() const;
  int layer_id() const;
  // The last forward's plan and routing, and the last calls' statistics (GPU times need the
  // stream to have finished).
  const Plan& last_plan() const;
  const RoutingStep& last_routing() const;
  const ForwardStats& last_forward_stats() const;
  const BackwardStats& last_backward_stats() const;
  // Chooses exact GEMM algorithms for row counts met for the first time, for at most `budget_ms`
  // of host time (< 0: all, and waits for the runtime's background refinement too); forward and
  // backward hand new row counts to a background thread of the runtime themselves.
  void refine_gemm_algorithms(double budget_ms);

 private:
  struct Impl;  // layer/layer_impl.h
  std::unique_ptr<Impl> impl_;
};

}  // namespace feplb::cuda
