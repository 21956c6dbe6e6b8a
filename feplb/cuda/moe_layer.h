// MoeLayer: one rank's FEPLB MoE layer forward on the GPU.
//
//   permute + count  ->  counts all-gather  ->  counts to host  ->  plan (scheduler thread)
//   phase 1: EP all-to-all-v (Transport)     ->  static experts' GEMMs (SMs)
//   phase 2, in parallel: the scheduler thread issues copy-engine copies of migrated experts'
//   weights and rows into their helpers' slots as soon as it has the plan (the copy stream waits
//   on the GPU for a flag the caller's stream raises when phase 1 has landed), each helper's
//   batch ended by a stream memory write of a flag; the helper's stream waits on the flag (no
//   SM) and runs its guest experts;
//   guest outputs go back to the owner by copy engine (flag again); reverse all-to-all-v;
//   weighted combine into `out`.
//
// The layer owns all its buffers (allocated once, in the constructor) and two threads' worth of
// host work: the caller's thread (launches) and its scheduler thread (plan + phase-2 copies).
// Every rank of the group derives the same plan from the same all-gathered counts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
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
#include "feplb/cuda/resources.h"
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
};

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

  const Plan& last_plan() const { return plan_; }
  const RoutingStep& last_routing() const { return routing_; }
  const ForwardStats& last_stats() const;  // timing fields need the stream to have finished
  int rank() const { return rank_; }

 private:
  struct Peer;  // a peer's registered buffers, as this rank addresses them
  void scheduler_loop();
  void plan_step();
  void issue_phase2_inputs();
  void layout_from_counts(int64_t num_tokens);
  void wait_seq(const std::atomic<uint32_t>& seq, uint32_t target, const char* what) const;

  LayerConfig cfg_;
  Transport& transport_;
  std::unique_ptr<RooflineCostModel> own_cost_;
  std::unique_ptr<Planner> planner_;
  int rank_ = 0, world_ = 1, experts_per_rank_ = 0;
  int64_t H_ = 0, F_ = 0, K_ = 0, E_ = 0;

  // Device buffers.  Shapes in rows of H (or 2F / F) bf16 unless said otherwise.
  DeviceBuffer<__nv_bfloat16> weights_;   // [experts_per_rank, 3HF]
  DeviceBuffer<__nv_bfloat16> slots_;     // [max_num_dyn, 3HF] guest weights
  DeviceBuffer<__nv_bfloat16> send_;      // [max_tokens*K, H]
  DeviceBuffer<__nv_bfloat16> ybuf_;      // [max_tokens*K, H] expert outputs back in send order
  DeviceBuffer<__nv_bfloat16> recv_;      // [recv_cap, H]
  DeviceBuffer<__nv_bfloat16> yrecv_;     // [recv_cap, H]
  DeviceBuffer<__nv_bfloat16> guest_in_;  // [guest_cap, H]
  DeviceBuffer<__nv_bfloat16> guest_out_; // [guest_cap, H]
  DeviceBuffer<__nv_bfloat16> gu_;        // [recv_cap + guest_cap, 2F]
  DeviceBuffer<__nv_bfloat16> act_;       // [recv_cap + guest_cap, F]
  DeviceBuffer<int32_t> counts_, cursor_, offsets_, order_;  // [E]
  DeviceBuffer<int32_t> counts_all_;      // [R, E]
  DeviceBuffer<int32_t> pair_pos_;        // [max_tokens*K]
  DeviceBuffer<uint32_t> flags_;          // [2R+1]: inputs landed from owner d; outputs back from helper
                                          // h; this rank's phase 1 landed
  PinnedBuffer<int32_t> counts_host_;     // [R, E]
  int64_t recv_cap_ = 0, guest_cap_ = 0;

  Stream copy_in_, copy_out_;
  CublasHandle cublas_;
  Event ev_counts_, ev_copy_in_done_, ev_guest_done_, ev_copy_out_done_;
  Event t_start_{true}, t_dispatched_{true}, t_static_{true}, t_waited_{true}, t_guest_{true}, t_end_{true};
  std::vector<Peer> peers_;

  // Per-forward host state (written by the caller's thread before the matching release-store,
  // or by the scheduler before its release-store).
  uint32_t seq_ = 0;
  int64_t num_tokens_ = 0;
  RoutingStep routing_;
  Plan plan_;
  std::vector<int64_t> expert_base_;   // [E] first recv row of each expert on its home rank
  std::vector<int64_t> slice_offset_;  // [plan.slices] first row of the slice within its expert
  std::vector<int64_t> guest_slot_, guest_off_;  // [plan.slices] on the helper; -1 if not a guest
  std::vector<int> local_index_;       // [E] position of each expert among its home's experts
  std::vector<Chunk> sends_, recvs_, back_sends_, back_recvs_;
  std::vector<CeCopy> ce_batch_, out_batch_;  // scheduler's and caller's phase-2 copy batches
  std::string layout_error_;           // set by the scheduler when a plan does not fit the buffers
  ForwardStats stats_;
  std::chrono::steady_clock::time_point t_counts_issued_;

  std::atomic<uint32_t> request_seq_{0}, plan_seq_{0}, copies_seq_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
  std::thread scheduler_;
};

}  // namespace feplb::cuda
