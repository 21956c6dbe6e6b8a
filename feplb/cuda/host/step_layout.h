// StepLayout: everything the GPU layer derives on the host for one (layer, micro-batch) from the
// plan, the routing counts, the topology and the buffer capacities: where each expert's rows sit
// on its home after phase 1, which of them each slice takes, each guest's weight slot and rows on
// its helper, each exported slice's gradient staging slot on its owner, and this rank's phase-1
// chunks and work lists. Plain host code (no CUDA type), identical on every rank given the same
// inputs, CPU-tested; no allocation once its vectors have grown to the largest step seen.
//
// Row units throughout: a "row" is one token-expert row of the hidden size; the layer multiplies
// by the row's bytes and adds its buffers' base pointers.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "feplb/core/plan.h"
#include "feplb/core/routing.h"
#include "feplb/core/topology.h"

namespace feplb::cuda {

// What the buffers of every rank can hold (the same on every rank).
struct LayoutCapacity {
  int64_t recv_rows = 0;      // rows a rank may receive in phase 1
  int64_t guest_rows = 0;     // guest rows a rank may compute
  int64_t guest_slots = 0;    // guest weight slots per rank (max_num_dyn)
  int64_t staging_slots = -1; // gradient staging slots per rank (< 0: not checked, forward only)
};

// One phase-1 chunk of this rank: `rows` rows to or from `peer`, starting at `row` of the send
// buffer (send order) or of the receive buffer (expert-major, this rank's experts).
struct RowChunk {
  int peer = 0;
  int64_t row = 0;
  int64_t rows = 0;
};

// Rows of one of this rank's experts computed here: `rows` rows from receive row `row`.
struct HomeWork {
  int slice = 0;        // index into plan.slices
  int expert = 0;
  int local_index = 0;  // the expert's position among this rank's experts (its weights)
  int64_t row = 0;
  int64_t rows = 0;
};

// A slice this rank computes for its owner: rows at `row` of this rank's guest buffer, weights in
// guest slot `slot`; results go back to receive row `owner_row` on the owner, weight gradients
// (training) to the owner's staging slot `staging_slot`.
struct GuestWork {
  int slice = 0;
  int expert = 0;
  int owner = 0;
  int slot = 0;
  int staging_slot = 0;
  int64_t row = 0;
  int64_t owner_row = 0;
  int64_t rows = 0;
};

// A slice of one of this rank's experts computed by `helper`: rows from receive row `src_row`
// here to guest row `dst_row` there, weights to its slot `slot`; its weight gradient comes back
// into this rank's staging slot `staging_slot`.
struct Export {
  int slice = 0;
  int expert = 0;
  int local_index = 0;
  int helper = 0;
  int slot = 0;
  int staging_slot = 0;
  int64_t src_row = 0;
  int64_t dst_row = 0;
  int64_t rows = 0;
};

// Which expert a guest weight slot of `rank` holds in this step (every rank's, for the slot
// pool's shared bookkeeping).
struct SlotUse {
  int slice = 0;
  int rank = 0;
  int slot = 0;
  int expert = 0;
};

class StepLayout {
 public:
  // Derives the layout of `plan` (for `routing`) as rank `rank` sees it. Never throws for a plan
  // that does not fit: error() says why (the same text on every rank), and the work lists are
  // then incomplete and must not be used. Throws InputError for inputs that disagree (routing or
  // plan shapes against the topology).
  void build(const Topology& topo, const RoutingStep& routing, const Plan& plan, int rank,
             const LayoutCapacity& capacity);

  // Empty when the plan fits every rank's buffers; otherwise one line naming the capacity.
  const std::string& error() const { return error_; }
  bool fits() const { return error_.empty(); }

  int rank() const { return rank_; }
  // Per rank: rows received in phase 1, guest rows and guest experts computed, slices exported.
  int64_t recv_rows(int rank) const { return recv_rows_[static_cast<size_t>(rank)]; }
  int64_t guest_rows(int rank) const { return guest_rows_[static_cast<size_t>(rank)]; }
  int64_t guest_experts(int rank) const { return guest_experts_[static_cast<size_t>(rank)]; }
  int64_t exported_slices(int rank) const { return exported_[static_cast<size_t>(rank)]; }
  // First receive row of `expert` on its home.
  int64_t expert_base(int expert) const { return expert_base_[static_cast<size_t>(expert)]; }

  // This rank's phase-1 chunks: sends in send order (experts grouped by home rank, each home's
  // experts ascending), receives grouped by source rank, each source's in this rank's expert
  // order (the order the source lists them in). Zero-row chunks included.
  std::span<const RowChunk> sends() const { return sends_; }
  std::span<const RowChunk> recvs() const { return recvs_; }
  // This rank's work: its experts' rows that stay here (static experts first, then the dynamic
  // ones' rows that were not moved), the guest slices it computes (grouped by owner, ascending),
  // and its slices computed elsewhere (grouped by helper, ascending).
  std::span<const HomeWork> home_work() const { return home_; }
  std::span<const GuestWork> guest_work() const { return guests_; }
  std::span<const Export> exports() const { return exports_; }
  bool exports_to(int helper) const { return exports_to_[static_cast<size_t>(helper)] != 0; }
  bool guests_from(int owner) const { return guests_from_[static_cast<size_t>(owner)] != 0; }
  // Every rank's guest weight slots in use this step.
  std::span<const SlotUse> slot_uses() const { return slot_uses_; }
  int64_t exported_rows() const;
  int64_t guest_rows_here() const { return guest_rows(rank_); }

 private:
  int rank_ = 0;
  std::string error_;
  std::vector<int64_t> recv_rows_, guest_rows_, guest_experts_, exported_;  // [R]
  std::vector<int64_t> expert_base_, taken_;                                // [E]
  std::vector<int> local_index_;                                            // [E]
  std::vector<int64_t> slice_offset_;                                       // [slices]
  std::vector<int> slice_slot_, slice_staging_;                             // [slices]
  std::vector<int64_t> slice_guest_row_;                                    // [slices]
  std::vector<RowChunk> sends_, recvs_;
  std::vector<HomeWork> home_;
  std::vector<GuestWork> guests_;
  std::vector<Export> exports_;
  std::vector<uint8_t> exports_to_, guests_from_;  // [R]
  std::vector<SlotUse> slot_uses_;
};

}  // namespace feplb::cuda
