#include "feplb/cuda/host/step_layout.h"

#include <algorithm>

#include "feplb/core/error.h"

namespace feplb::cuda {

void StepLayout::build(const Topology& topo, const RoutingStep& routing, const Plan& plan, int rank,
                       const LayoutCapacity& capacity) {
  const int R = topo.num_ranks();
  const int E = topo.num_experts();
  FEPLB_REQUIRE_INPUT(routing.num_ranks == R && routing.num_experts == E,
                      "step layout: routing of {} ranks x {} experts, topology {} x {}", routing.num_ranks,
                      routing.num_experts, R, E);
  FEPLB_REQUIRE_INPUT(rank >= 0 && rank < R, "step layout: rank {} of {}", rank, R);
  FEPLB_REQUIRE_INPUT(static_cast<int>(plan.dynamic.size()) == E, "step layout: plan marks {} experts, topology has {}",
                      plan.dynamic.size(), E);
  rank_ = rank;
  error_.clear();
  const auto fill = [](auto& v, size_t n, auto value) { v.assign(n, value); };
  fill(recv_rows_, static_cast<size_t>(R), int64_t{0});
  fill(guest_rows_, static_cast<size_t>(R), int64_t{0});
  fill(guest_experts_, static_cast<size_t>(R), int64_t{0});
  fill(exported_, static_cast<size_t>(R), int64_t{0});
  fill(exports_to_, static_cast<size_t>(R), uint8_t{0});
  fill(guests_from_, static_cast<size_t>(R), uint8_t{0});
  fill(expert_base_, static_cast<size_t>(E), int64_t{0});
  fill(taken_, static_cast<size_t>(E), int64_t{0});
  fill(local_index_, static_cast<size_t>(E), 0);

  // Phase 1 lands each home's experts one after another, each expert's rows in source-rank order.
  for (int d = 0; d < R; ++d) {
    int64_t base = 0;
    int i = 0;
    for (int e : topo.local_experts(d)) {
      expert_base_[e] = base;
      local_index_[e] = i++;
      base += routing.expert_counts[e];
    }
    recv_rows_[d] = base;
    if (base > capacity.recv_rows && error_.empty()) {
      error_ = fmt::format("rank {} receives {} rows in phase 1, over its capacity {} (raise recv_capacity_rows)", d,
                           base, capacity.recv_rows);
    }
  }

  // Slices: the rows each takes of its expert (in plan order), and for a guest its slot and rows
  // on the helper and the staging slot its gradient lands in on the owner.
  const size_t n = plan.slices.size();
  fill(slice_offset_, n, int64_t{0});
  fill(slice_slot_, n, -1);
  fill(slice_staging_, n, -1);
  fill(slice_guest_row_, n, int64_t{-1});
  slot_uses_.clear();
  for (size_t i = 0; i < n; ++i) {
    const Slice& s = plan.slices[i];
    FEPLB_REQUIRE_INPUT(s.expert >= 0 && s.expert < E && s.gpu >= 0 && s.gpu < R && s.rows >= 0,
                        "step layout: slice {} (expert {}, GPU {}, {} rows) outside the topology", i, s.expert, s.gpu,
                        s.rows);
    if (s.source != RowSource::kHome) {
      if (error_.empty()) error_ = "the GPU layer runs plans whose rows are dispatched to the experts' homes only";
      continue;
    }
    slice_offset_[i] = taken_[s.expert];
    taken_[s.expert] += s.rows;
    const int home = topo.home(s.expert);
    if (s.gpu != home) {
      slice_slot_[i] = static_cast<int>(guest_experts_[s.gpu]++);
      slice_guest_row_[i] = guest_rows_[s.gpu];
      guest_rows_[s.gpu] += s.rows;
      slice_staging_[i] = static_cast<int>(exported_[home]++);
      slot_uses_.push_back({static_cast<int>(i), s.gpu, slice_slot_[i], s.expert});
    }
  }
  if (!error_.empty()) return;
  for (int e = 0; e < E; ++e) {
    FEPLB_CHECK(taken_[e] == routing.expert_counts[e], "plan computes {} rows of expert {}, routed {}", taken_[e], e,
                routing.expert_counts[e]);
  }
  for (int g = 0; g < R && error_.empty(); ++g) {
    if (guest_experts_[g] > capacity.guest_slots) {
      error_ = fmt::format("plan gives GPU {} {} guest experts, over its {} guest weight slots (max_num_dyn)", g,
                           guest_experts_[g], capacity.guest_slots);
    } else if (guest_rows_[g] > capacity.guest_rows) {
      error_ = fmt::format("plan gives GPU {} {} guest rows, over its capacity {} (raise guest_capacity_rows)", g,
                           guest_rows_[g], capacity.guest_rows);
    } else if (capacity.staging_slots >= 0 && exported_[g] > capacity.staging_slots) {
      error_ = fmt::format("plan exports {} expert slices from GPU {}, over its {} gradient staging slots (raise the "
                           "runtime's staging slots)",
                           exported_[g], g, capacity.staging_slots);
    }
  }
  if (!error_.empty()) return;

  // This rank's phase-1 chunks.
  sends_.clear();
  recvs_.clear();
  int64_t send_row = 0;
  for (int d = 0; d < R; ++d) {
    for (int e : topo.local_experts(d)) {
      const int64_t rows = routing.at(rank, e);
      sends_.push_back({d, send_row, rows});
      send_row += rows;
    }
  }
  for (int src = 0; src < R; ++src) {
    for (int e : topo.local_experts(rank)) {
      int64_t row = expert_base_[e];
      for (int before = 0; before < src; ++before) row += routing.at(before, e);
      recvs_.push_back({src, row, routing.at(src, e)});
    }
  }

  // This rank's work lists.
  home_.clear();
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < n; ++i) {
      const Slice& s = plan.slices[i];
      if (s.gpu != rank || topo.home(s.expert) != rank || plan.dynamic[s.expert] != pass) continue;
      home_.push_back({static_cast<int>(i), s.expert, local_index_[s.expert], expert_base_[s.expert] + slice_offset_[i],
                       s.rows});
    }
  }
  guests_.clear();
  exports_.clear();
  for (int peer = 0; peer < R; ++peer) {
    for (size_t i = 0; i < n; ++i) {
      const Slice& s = plan.slices[i];
      if (slice_slot_[i] < 0) continue;
      const int home = topo.home(s.expert);
      const int64_t home_row = expert_base_[s.expert] + slice_offset_[i];
      if (s.gpu == rank && home == peer) {
        guests_.push_back({static_cast<int>(i), s.expert, home, slice_slot_[i], slice_staging_[i], slice_guest_row_[i],
                           home_row, s.rows});
        guests_from_[peer] = 1;
      }
      if (home == rank && s.gpu == peer) {
        exports_.push_back({static_cast<int>(i), s.expert, local_index_[s.expert], s.gpu, slice_slot_[i],
                            slice_staging_[i], home_row, slice_guest_row_[i], s.rows});
        exports_to_[peer] = 1;
      }
    }
  }
}

int64_t StepLayout::exported_rows() const {
  int64_t rows = 0;
  for (const Export& x : exports_) rows += x.rows;
  return rows;
}

}  // namespace feplb::cuda
