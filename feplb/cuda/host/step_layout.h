// StepLayout: everything the GPU layer derives on the host for one (layer, micro-batch) from the
// plan, the routing counts, the topology and the buffer capacities: where each expert's rows sit
// after phase 1, which of them each slice takes, each guest's weight slot and rows on its helper,
// each exported slice's gradient staging slot on its owner, and this rank's phase-1 chunks and
// work lists. Plain host code (no CUDA type), identical on every rank given the same inputs,
// CPU-tested; no allocation once its vectors have grown to the largest step seen.
//
// Two kinds of guest slice (plan.h, RowSource):
//  * kHome (the paper's two-phase path): phase 1 lands the rows on the expert's home, and the
//    copy engine moves them on to the helper and the outputs back;
//  * kDispatched (rows in one hop): phase 1 sends them straight into the helper's guest rows and
//    the reverse all-to-all-v (the mirror of phase 1) brings the outputs back to the tokens'
//    ranks. Per expert, the rows are taken in source-rank order and handed to the GPUs that
//    receive them in ascending GPU order (MoonEP's ordinal rule, the one feplb's metrics count
//    dispatch traffic with): the home receives its own slice plus the kHome slices' rows, each
//    kDispatched slice its rows; so each source's rows of an expert split into at most one
//    sub-chunk per receiver.
// Prefetched weights (CopyKind::kPrefetchWeights, copied before routing): per helper, the plan's
// prefetches in plan order take guest slots 0, 1, ... (prefetch_slots(): MoeLayer::prefetch
// copies into the same slots); a slice on a prefetched (expert, helper) pair uses that slot, the
// other guests the slots after them, and an unused prefetch keeps its slot idle.
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
  int64_t recv_rows = 0;       // rows a rank may receive in phase 1
  int64_t guest_rows = 0;      // guest rows a rank may compute
  int64_t guest_slots = 0;     // guest weight slots per rank (max_num_dyn)
  int64_t staging_slots = -1;  // gradient staging slots per rank (< 0: not checked, forward only)
};

// One phase-1 chunk of this rank: `rows` rows to or from `peer`, starting at `row` of the send
// buffer (send order) or of the receive buffer (expert-major, this rank's experts), or, for a
// receive with `guest` set, of the guest rows (rows sent straight to this rank as a helper).
struct RowChunk {
  int peer = 0;
  int64_t row = 0;
  int64_t rows = 0;
  bool guest = false;
};

// Rows of one of this rank's experts computed here: `rows` rows from receive row `row`.
struct HomeWork {
  int slice = 0;  // index into plan.slices
  int expert = 0;
  int local_index = 0;  // the expert's position among this rank's experts (its weights)
  int64_t row = 0;
  int64_t rows = 0;
};

// A slice this rank computes for its owner: rows at `row` of this rank's guest buffer, weights in
// guest slot `slot`; results go back to receive row `owner_row` on the owner (kHome rows; -1 for
// dispatched ones, whose results go back in the reverse all-to-all-v), weight gradients
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
  bool dispatched = false;  // rows arrive in phase 1 (one hop), not by copy from the owner
  bool prefetched = false;  // weights prefetched into `slot` before routing (the plan says so)
};

// A slice of one of this rank's experts computed by `helper`: rows from receive row `src_row`
// here to guest row `dst_row` there (kHome rows; src_row -1 for dispatched ones, which phase 1
// sends there), weights to its slot `slot`; its weight gradient comes back into this rank's
// staging slot `staging_slot`.
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
  bool dispatched = false;
  bool prefetched = false;
};

// Which expert a guest weight slot of `rank` holds in this step (every rank's, for the slot
// pool's shared bookkeeping).
struct SlotUse {
  int slice = 0;
  int rank = 0;
  int slot = 0;
  int expert = 0;
};

// The guest slot each prefetched (expert, helper) pair takes on its helper: per helper, the
// kPrefetchWeights copies of `copies` in list order take slots 0, 1, ...; slot[i] is copies[i]'s
// (-1 for copies of other kinds). `next` is scratch ([num_ranks]). Out-of-range helpers are the
// caller's to reject.
void prefetch_slots(std::span<const Copy> copies, int num_ranks, std::vector<int>& slot,
                    std::vector<int>& next);

class StepLayout {
 public:
  // Derives the layout of `plan` (for `routing`) as rank `rank` sees it. Never throws for a plan
  // that does not fit: error() says why (the same text on every rank), and the work lists are
  // then incomplete and must not be used. Throws InputError for inputs that disagree (routing or
  // plan shapes against the topology, a plan without its schedule). The plan's schedule
  // (Plan::schedule, written by its planner) orders the exports: helper by helper, the
  // helpers this rank sends phase-2 copies to in the schedule's issue order, then the others
  // ascending; and the guests: owner by owner, first the owners whose guests here wait for no
  // phase-2 copy (ascending), then the schedule's turns (when the owner's copies land), so the
  // layer issues and runs them as the planner modelled.
  void build(const Topology& topo, const RoutingStep& routing, const Plan& plan, int rank,
             const LayoutCapacity& capacity);

  // Empty when the plan fits every rank's buffers; otherwise one line naming the capacity.
  const std::string& error() const { return error_; }
  bool fits() const { return error_.empty(); }

  int rank() const { return rank_; }
  // Per rank: rows received at its experts in phase 1, guest rows (copied or dispatched) and guest
  // weight slots in use (guest experts plus idle prefetched slots), slices exported.
  int64_t recv_rows(int rank) const { return recv_rows_[static_cast<size_t>(rank)]; }
  int64_t guest_rows(int rank) const { return guest_rows_[static_cast<size_t>(rank)]; }
  int64_t guest_experts(int rank) const { return guest_experts_[static_cast<size_t>(rank)]; }
  int64_t exported_slices(int rank) const { return exported_[static_cast<size_t>(rank)]; }
  // First receive row of `expert` on its home.
  int64_t expert_base(int expert) const { return expert_base_[static_cast<size_t>(expert)]; }

  // This rank's phase-1 chunks: sends in send order (experts grouped by home rank, each home's
  // experts ascending; an expert whose rows go to several GPUs in one hop as one sub-chunk per
  // receiver, ascending GPU), receives grouped by source rank, each source's in send order (the
  // order the source lists them in). Chunks to an expert's home are listed even with zero rows;
  // one-hop sub-chunks to helpers only when they carry rows (both sides know which). The
  // reverse all-to-all-v is the mirror: receives become sends.
  std::span<const RowChunk> sends() const { return sends_; }
  std::span<const RowChunk> recvs() const { return recvs_; }
  // This rank's work: its experts' rows that stay here (static experts first, then the dynamic
  // ones' rows that were not moved), the guest slices it computes (grouped by owner, owners in
  // the order their last copy to this rank lands, modelled: the order the layer runs them in,
  // each once its owner's copies landed), and its slices computed elsewhere (grouped by helper,
  // in build()'s issue order).
  std::span<const HomeWork> home_work() const { return home_; }
  std::span<const GuestWork> guest_work() const { return guests_; }
  std::span<const Export> exports() const { return exports_; }
  // Slices of this rank's experts computed by `helper` / of `owner`'s experts computed here.
  bool exports_to(int helper) const { return exports_to_[static_cast<size_t>(helper)] != 0; }
  bool guests_from(int owner) const { return guests_from_[static_cast<size_t>(owner)] != 0; }
  // Of those, some with rows copied by the copy engine (kHome): this rank's rows to `helper` and
  // their outputs (dX) back / `owner`'s rows to here and back.
  bool rows_copied_to(int helper) const { return rows_to_[static_cast<size_t>(helper)] != 0; }
  bool rows_copied_from(int owner) const { return rows_from_[static_cast<size_t>(owner)] != 0; }
  // Slices whose rows go straight to their helper in phase 1 (one hop), over the whole plan.
  bool has_dispatched() const { return has_dispatched_; }
  // Every rank's guest weight slots in use this step.
  std::span<const SlotUse> slot_uses() const { return slot_uses_; }
  int64_t exported_rows() const;
  int64_t guest_rows_here() const { return guest_rows(rank_); }

 private:
  // One receiver of an expert's rows in phase 1 (its home, or a kDispatched slice's helper).
  struct Receiver {
    int expert = 0;
    int gpu = 0;
    int slice = -1;  // the kDispatched slice; -1: the home
    int64_t rows = 0;
    int64_t ordinal = 0;  // its first row among the expert's rows in source-rank order
  };
  void reset(const Topology& topo);
  void check_copies(const Topology& topo, const Plan& plan);
  void place_slices(const Topology& topo, const Plan& plan);
  void place_homes(const Topology& topo, const LayoutCapacity& capacity);
  void build_receivers(const Topology& topo);
  void build_chunks(const Topology& topo, const RoutingStep& routing);
  void build_work(const Topology& topo, const Plan& plan);

  int rank_ = 0;
  std::string error_;
  bool has_dispatched_ = false;
  std::vector<int64_t> recv_rows_, guest_rows_, guest_experts_, exported_;  // [R]
  std::vector<int64_t> expert_base_, taken_, home_rows_, computed_, pre_;   // [E]
  std::vector<int> local_index_, send_order_;                               // [E]
  std::vector<int> receiver_begin_;                                         // [E + 1]
  std::vector<Receiver> receivers_;                 // by expert, ascending GPU
  std::vector<int64_t> slice_offset_;               // [slices]
  std::vector<int> slice_slot_, slice_staging_;     // [slices]
  std::vector<int64_t> slice_guest_row_;            // [slices]
  std::vector<uint8_t> slice_prefetched_;           // [slices]
  std::vector<int> prefetch_slot_, prefetch_next_;  // [copies], [R]
  std::vector<int> helper_order_;                   // [R] the order exports are issued in
  std::vector<int> owner_order_;                    // [R] the order guests are listed in
  std::vector<int> turn_owners_;                    // the schedule's turns here, by owner
  std::vector<uint8_t> listed_;                     // [R] already in the order being built
  std::vector<int64_t> run_;                        // [receivers] rows received so far per receiver
  std::vector<RowChunk> sends_, recvs_;
  std::vector<HomeWork> home_;
  std::vector<GuestWork> guests_;
  std::vector<Export> exports_;
  std::vector<uint8_t> exports_to_, guests_from_, rows_to_, rows_from_;  // [R]
  std::vector<SlotUse> slot_uses_;
};

}  // namespace feplb::cuda
