// MoeLayer: one rank's FEPLB MoE layer on the GPU, forward and backward.
//
//   permute + count  ->  counts all-gather  ->  counts to host  ->  plan (scheduler thread)
//   phase 1: EP all-to-all-v (Transport)     ->  static experts' GEMMs (SMs)
//   phase 2, in parallel: the scheduler thread issues copy-engine copies of migrated experts'
//   weights and rows into their helpers' slots as soon as it has the plan (its copy stream waits
//   for the event the caller's stream records when phase 1 has landed), each helper's batch
//   ended by a transport signal (SM-free); the helper's stream waits for it and runs its guests;
//   guest outputs go back to the owner by copy engine (signal again); reverse all-to-all-v;
//   weighted combine into `out`.
//
// Backward (training layers) reuses the forward's plan for that micro-batch: the output gradient
// goes to the experts' homes by the same all-to-all; migrated slices' gradient rows (and their
// weights again, if another layer reused the slot) go to the helper by copy engine; the helper
// computes dX and dW; dX rows come back by copy engine, dW (fp32) into a staging slot on the
// owner, which adds it into the expert's fp32 main gradient. Optimizer state never moves.
//
// The layer owns its buffers (allocated once, in the constructor; guest weight and gradient slots
// come from an ExpertSlotPool all layers of a rank share) and two threads' worth of host work:
// the caller's thread (launches) and its scheduler thread (plan + phase-2 copies). Every rank of
// the group derives the same plan from the same all-gathered counts. One micro-batch at a time:
// backward() follows the forward() of the same micro-batch, before the next forward().
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/routing.h"
#include "feplb/core/topology.h"
#include "feplb/cuda/ce_copy.h"
#include "feplb/cuda/gemm.h"
#include "feplb/cuda/resources.h"
#include "feplb/cuda/slot_pool.h"
#include "feplb/cuda/transport.h"

namespace feplb::cuda {

struct LayerConfig {
  Topology topo = Topology::contiguous(1, 8, 1);
  ExpertShape shape;           // bf16 only; hidden and ffn multiples of 8
  int top_k = 1;
  int64_t max_tokens = 0;      // per rank per forward
  std::string policy = "feplb";
  Knobs knobs;
  int64_t recv_capacity_rows = 0;   // rows a rank may receive in phase 1; 0 = R * max_tokens * top_k
  int64_t guest_capacity_rows = 0;  // guest rows a rank may compute; 0 = 2 * max_tokens * top_k
  double timeout_s = 60.0;          // a peer silent this long is an error
  bool timing = false;              // record timing events (bench): see ForwardStats
  bool sync_before_counts = false;  // bench: synchronise before the counts go to the host
  std::string name = "moe";         // names this layer's peer buffers (unique per layer)
  bool training = false;            // backward(): fp32 main gradient, activations kept
  // Shared guest slots (must outlive the layer; training layers need a training pool). Null: the
  // layer makes its own pool of max_num_dyn slots (and, training, default_staging_slots()).
  ExpertSlotPool* pool = nullptr;
};

// Staging slots a training pool gets by default: every expert slice a rank may export under the
// feplb planner's limits (dyn x max_helpers_per_expert), and at least max_num_dyn.
int default_staging_slots(const Knobs& knobs);

// Host-side measurements of the last forward (microseconds, steady clock).
struct ForwardStats {
  double counts_to_host_us = 0;  // counts D2H issued (or ready on the GPU) -> seen by the scheduler
  double plan_us = 0;            // planner call
  double plan_to_first_copy_us = 0;  // plan ready -> first phase-2 copy issued (0: no copy)
  double counts_to_first_copy_us = 0;  // sum of the above: counts ready -> first copy issued
  int64_t copies = 0;            // phase-2 copy calls this rank issued
  int64_t guest_rows = 0, exported_rows = 0;
  // With LayerConfig::timing, GPU times (ms) on the compute stream:
  float forward_ms = 0;          // the whole forward
  float static_ms = 0;           // dispatch end -> own experts' GEMMs done
  float wait_ms = 0;             // idle waiting for phase-2 inputs after that (exposed copy time)
  float guest_ms = 0;            // guest experts' GEMMs
};

// The last backward (GPU times need LayerConfig::timing and the stream to have finished).
struct BackwardStats {
  int64_t copies = 0;            // phase-2 copy calls this rank issued (inputs and results)
  int64_t weight_recopies = 0;   // guest weights this rank copied again (slot reused since forward)
  int64_t guest_rows = 0;
  float backward_ms = 0;         // the whole backward
  float static_ms = 0;           // dispatch end -> own experts' backward done
  float wait_ms = 0;             // idle waiting for phase-2 inputs after that (exposed copy time)
  float guest_ms = 0;            // guests' backward
  float results_wait_ms = 0;     // idle waiting for the helpers' dX after that
};

class MoeLayer {
 public:
  // `transport` and `cost` (may be null: roofline from the knobs) must outlive the layer.
  MoeLayer(const LayerConfig& config, Transport& transport, const GemmCostModel* cost = nullptr);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // This rank's experts' weights, [experts_per_rank, 3 H F] bf16 (per expert: gate|up [H, 2F],
  // then down [F, H], row-major), copied into the layer's buffer on `stream`.
  void set_weights(const __nv_bfloat16* local_weights, cudaStream_t stream);
  const __nv_bfloat16* weights() const { return weights_.get(); }

  // hidden [S, H], topk_idx [S, K] (global expert ids), topk_weight [S, K] -> out [S, H].
  // Stream-ordered on `stream`; all ranks of the group call it for the same micro-batch.
  void forward(const __nv_bfloat16* hidden, const int32_t* topk_idx, const float* topk_weight,
               int64_t num_tokens, __nv_bfloat16* out, cudaStream_t stream);

  // Training layers. grad_out [S, H] for the last forward's tokens -> grad_hidden [S, H],
  // grad_topk_weight [S, K] (fp32); adds this rank's experts' weight gradients into main_grad().
  void backward(const __nv_bfloat16* grad_out, const float* topk_weight, __nv_bfloat16* grad_hidden,
                float* grad_topk_weight, cudaStream_t stream);
  // fp32 [experts_per_rank, 3HF], laid out like the weights (training layers).
  float* main_grad() const { return main_grad_.get(); }
  void zero_grad(cudaStream_t stream);
  // Later work on `stream` sees every gradient of the last backward in main_grad() (the helpers'
  // contributions are added on a side stream, off the critical path). Before an optimizer step.
  void sync_gradients(cudaStream_t stream);
  __nv_bfloat16* mutable_weights() { return weights_.get(); }
  int64_t weight_elems() const { return static_cast<int64_t>(weights_.size()); }
  const BackwardStats& last_backward_stats() const;
  // Device memory this layer allocated (its pool's excluded) and its pool's.
  size_t device_bytes() const;
  const ExpertSlotPool& pool() const { return *pool_; }

  // Chooses exact GEMM algorithms for the row counts this layer met for the first time, for at
  // most `budget_ms` of host time (< 0: all). forward() and backward() spend up to 1 ms on it after
  // enqueueing their work; call it when the host has time to spare (feplb/cuda/gemm.h).
  void refine_gemm_algorithms(double budget_ms) { gemm_.refine(budget_ms); }

  const Plan& last_plan() const { return plan_; }
  const RoutingStep& last_routing() const { return routing_; }
  const ForwardStats& last_stats() const;  // timing fields need the stream to have finished
  int rank() const { return rank_; }

 private:
  struct Peer;  // a peer's registered buffers, as this rank addresses them
  void scheduler_loop();
  void plan_step();
  void issue_phase2_inputs(bool backward);
  void layout_from_counts(int64_t num_tokens);
  bool exports_to(int helper) const;   // this rank sends slices to `helper` this step
  bool guests_from(int owner) const;   // this rank computes slices of `owner`'s experts
  void dispatch_chunks(__nv_bfloat16* send_base, __nv_bfloat16* recv_base);
  int64_t send_rows_back(cudaStream_t copy_stream);
  void phase1(__nv_bfloat16* recv_base, cudaStream_t stream);
  void for_each_home_slice(const std::function<void(const Slice&, int64_t)>& f) const;
  void reverse_exchange(const __nv_bfloat16* recv_base, cudaStream_t stream);
  void wait_seq(const std::atomic<uint32_t>& seq, uint32_t target, const char* what) const;

  LayerConfig cfg_;
  Transport& transport_;
  std::unique_ptr<RooflineCostModel> own_cost_;
  std::unique_ptr<Planner> planner_;
  int rank_ = 0, world_ = 1, experts_per_rank_ = 0;
  int64_t H_ = 0, F_ = 0, K_ = 0, E_ = 0;

  // Device buffers.  Shapes in rows of H (or 2F / F) bf16 unless said otherwise.
  // Kept from forward to backward: recv_ (X at home), guest_in_ (guests' X), gu_, act_, ybuf_,
  // pair_pos_ and the plan; backward overwrites gu_/act_ with their gradients.
  DeviceBuffer<__nv_bfloat16> weights_;   // [experts_per_rank, 3HF]
  DeviceBuffer<float> main_grad_;         // [experts_per_rank, 3HF] (training)
  DeviceBuffer<__nv_bfloat16> send_;      // [max_tokens*K, H] X in send order; backward: dY
  DeviceBuffer<__nv_bfloat16> ybuf_;      // [max_tokens*K, H] Y back in send order; backward: dX
  DeviceBuffer<__nv_bfloat16> recv_;      // [recv_cap, H] X at the experts' homes
  DeviceBuffer<__nv_bfloat16> yrecv_;     // [recv_cap, H] Y at home (peers write guests' Y); bwd: dX
  DeviceBuffer<__nv_bfloat16> dyrecv_;    // [recv_cap, H] dY at home (training)
  DeviceBuffer<__nv_bfloat16> guest_in_;  // [guest_cap, H] guests' X (owners write)
  DeviceBuffer<__nv_bfloat16> guest_dy_;  // [guest_cap, H] guests' dY (owners write; training)
  DeviceBuffer<__nv_bfloat16> guest_out_; // [guest_cap, H] guests' Y; backward: guests' dX
  DeviceBuffer<__nv_bfloat16> gu_;        // [recv_cap + guest_cap, 2F]
  DeviceBuffer<__nv_bfloat16> act_;       // [recv_cap + guest_cap, F]
  DeviceBuffer<int32_t> counts_, cursor_, offsets_, order_;  // [E]
  DeviceBuffer<int32_t> counts_all_;      // [R, E]
  DeviceBuffer<int32_t> pair_pos_;        // [max_tokens*K]
  PinnedBuffer<int32_t> counts_host_;     // [R, E]
  // Signal slots: [0, R) inputs from owner d landed here; [R, 2R) outputs (forward) or dX
  // (backward) back from helper h; [2R, 3R) dW back from helper h.
  std::unique_ptr<Transport::Signals> signals_;
  std::unique_ptr<ExpertSlotPool> own_pool_;
  ExpertSlotPool* pool_ = nullptr;
  int layer_id_ = 0;
  int64_t recv_cap_ = 0, guest_cap_ = 0;

  Stream copy_in_, copy_out_;
  GemmEngine gemm_;
  Event ev_counts_, ev_dispatched_, ev_copy_in_done_, ev_guest_done_, ev_copy_out_done_, ev_grads_done_;
  Event t_start_{true}, t_dispatched_{true}, t_static_{true}, t_waited_{true}, t_guest_{true}, t_end_{true};
  Event tb_start_{true}, tb_dispatched_{true}, tb_static_{true}, tb_waited_{true}, tb_guest_{true},
      tb_results_{true}, tb_end_{true};
  std::vector<Peer> peers_;

  // Per-forward host state (written by the caller's thread before the matching release-store,
  // or by the scheduler before its release-store).
  uint32_t seq_ = 0;            // forwards and backwards so far: every signal's value
  uint32_t forward_seq_ = 0;    // seq_ of the last forward
  bool saved_for_backward_ = false;
  bool backward_job_ = false;   // the scheduler's current job: backward inputs (no plan)
  int64_t num_tokens_ = 0;
  RoutingStep routing_;
  Plan plan_;
  std::vector<int64_t> expert_base_;   // [E] first recv row of each expert on its home rank
  std::vector<int64_t> slice_offset_;  // [plan.slices] first row of the slice within its expert
  std::vector<int64_t> guest_slot_, guest_off_;  // [plan.slices] on the helper; -1 if not a guest
  std::vector<int64_t> export_slot_;   // [plan.slices] gradient staging slot on the owner; -1
  std::vector<uint8_t> recopy_;        // [plan.slices] backward copies the weights again
  std::vector<int64_t> taken_, slot_count_, row_count_, export_count_;  // layout scratch
  std::vector<int> local_index_;       // [E] position of each expert among its home's experts
  std::vector<Chunk> sends_, recvs_, back_sends_, back_recvs_;
  std::vector<CeCopy> ce_batch_, out_batch_;  // scheduler's and caller's phase-2 copy batches
  std::string layout_error_;           // set by the scheduler when a plan does not fit the buffers
  ForwardStats stats_;
  BackwardStats bstats_;
  std::chrono::steady_clock::time_point t_counts_issued_;

  std::atomic<uint32_t> request_seq_{0}, plan_seq_{0}, copies_seq_{0}, dispatched_seq_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
  std::thread scheduler_;
};

}  // namespace feplb::cuda
