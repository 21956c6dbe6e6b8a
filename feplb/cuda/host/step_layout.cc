#include "feplb/cuda/host/step_layout.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "feplb/core/error.h"

namespace feplb::cuda {

namespace {

// Rows shared by the ordinal ranges [a, a + n) and [b, b + m).
int64_t overlap(int64_t a, int64_t n, int64_t b, int64_t m) {
  return std::max<int64_t>(0, std::min(a + n, b + m) - std::max(a, b));
}

}  // namespace

void prefetch_slots(std::span<const Copy> copies, int num_ranks, std::vector<int>& slot,
                    std::vector<int>& next) {
  next.assign(static_cast<size_t>(num_ranks), 0);
  slot.assign(copies.size(), -1);
  for (size_t i = 0; i < copies.size(); ++i) {
    const Copy& c = copies[i];
    if (c.kind != CopyKind::kPrefetchWeights || c.dst_gpu < 0 || c.dst_gpu >= num_ranks) continue;
    slot[i] = next[static_cast<size_t>(c.dst_gpu)]++;
  }
}

void StepLayout::build(const Topology& topo, const RoutingStep& routing, const Plan& plan, int rank,
                       const LayoutCapacity& capacity) {
  const int R = topo.num_ranks();
  const int E = topo.num_experts();
  FEPLB_REQUIRE_INPUT(routing.num_ranks == R && routing.num_experts == E,
                      "step layout: routing of {} ranks x {} experts, topology {} x {}",
                      routing.num_ranks, routing.num_experts, R, E);
  FEPLB_REQUIRE_INPUT(rank >= 0 && rank < R, "step layout: rank {} of {}", rank, R);
  FEPLB_REQUIRE_INPUT(static_cast<int>(plan.dynamic.size()) == E,
                      "step layout: plan marks {} experts, topology has {}", plan.dynamic.size(),
                      E);
  FEPLB_REQUIRE_INPUT(plan.schedule.written(plan.copies.size(), R),
                      "step layout: the plan has no schedule for its {} copies on {} GPUs "
                      "(Planner::plan writes one; a plan made by hand needs ScheduleWriter::write)",
                      plan.copies.size(), R);
  rank_ = rank;
  reset(topo);
  check_copies(topo, plan);
  place_slices(topo, plan);
  if (!error_.empty()) return;
  for (int e = 0; e < E; ++e) {
    FEPLB_CHECK(computed_[e] == routing.expert_counts[e],
                "plan computes {} rows of expert {}, routed {}", computed_[e], e,
                routing.expert_counts[e]);
  }
  place_homes(topo, capacity);
  if (!error_.empty()) return;
  build_receivers(topo);
  build_chunks(topo, routing);
  build_work(topo, plan);
}

namespace {
template <typename V, typename T>
void fill(V& v, size_t n, T value) {
  v.assign(n, value);
}
}  // namespace

// Per-step vectors sized for this topology, zeroed; every expert's local index and send order.
void StepLayout::reset(const Topology& topo) {
  const int R = topo.num_ranks();
  const int E = topo.num_experts();
  error_.clear();
  has_dispatched_ = false;
  fill(recv_rows_, static_cast<size_t>(R), int64_t{0});
  fill(guest_rows_, static_cast<size_t>(R), int64_t{0});
  fill(exported_, static_cast<size_t>(R), int64_t{0});
  fill(exports_to_, static_cast<size_t>(R), uint8_t{0});
  fill(guests_from_, static_cast<size_t>(R), uint8_t{0});
  fill(rows_to_, static_cast<size_t>(R), uint8_t{0});
  fill(rows_from_, static_cast<size_t>(R), uint8_t{0});
  fill(expert_base_, static_cast<size_t>(E), int64_t{0});
  fill(taken_, static_cast<size_t>(E), int64_t{0});
  fill(home_rows_, static_cast<size_t>(E), int64_t{0});
  fill(computed_, static_cast<size_t>(E), int64_t{0});
  fill(local_index_, static_cast<size_t>(E), 0);
  send_order_.clear();
  for (int d = 0; d < R; ++d) {
    int i = 0;
    for (int e : topo.local_experts(d)) {
      local_index_[e] = i++;
      send_order_.push_back(e);
    }
  }
}

// What the GPU layer runs: rows dispatched to the experts' homes or straight to helpers, guest
// weights copied for this micro-batch or prefetched; no resident replicas. Prefetches take the
// first guest slots of their helpers.
void StepLayout::check_copies(const Topology& topo, const Plan& plan) {
  const int R = topo.num_ranks();
  const int E = topo.num_experts();
  // What the GPU layer runs: rows dispatched to the experts' homes or straight to helpers, guest
  // weights copied for this micro-batch or prefetched; no resident replicas.
  if (!plan.resident.empty())
    error_ = "the GPU layer runs no resident replicas (plans of EPLB-style policies)";
  prefetch_slots(plan.copies, R, prefetch_slot_, prefetch_next_);
  for (size_t i = 0; i < plan.copies.size(); ++i) {
    const Copy& c = plan.copies[i];
    if (c.kind == CopyKind::kReplicaWeights && error_.empty()) {
      error_ = "the GPU layer runs no resident replicas (plans of EPLB-style policies)";
    }
    if (c.kind != CopyKind::kPrefetchWeights) continue;
    FEPLB_REQUIRE_INPUT(c.expert >= 0 && c.expert < E && c.dst_gpu >= 0 && c.dst_gpu < R,
                        "step layout: prefetch of expert {} to GPU {} outside the topology",
                        c.expert, c.dst_gpu);
    bool again = false;
    for (size_t j = 0; j < i; ++j) {
      const Copy& o = plan.copies[j];
      again = again || (o.kind == CopyKind::kPrefetchWeights && o.expert == c.expert &&
                        o.dst_gpu == c.dst_gpu);
    }
    if ((c.src_gpu != topo.home(c.expert) || c.dst_gpu == c.src_gpu || again) && error_.empty()) {
      error_ = fmt::format(
          "plan prefetches expert {} from GPU {} to GPU {}: not once, from its home {} to another "
          "GPU",
          c.expert, c.src_gpu, c.dst_gpu, topo.home(c.expert));
    }
  }
  // Guest slots: the prefetches' first, in plan order, then the other guests.
  guest_experts_.assign(prefetch_next_.begin(), prefetch_next_.end());
}

void StepLayout::place_slices(const Topology& topo, const Plan& plan) {
  const int R = topo.num_ranks();
  const int E = topo.num_experts();
  // Slices: the rows each kHome slice takes of its expert's rows on the home (in plan order); for
  // a guest its slot and rows on the helper and the staging slot its gradient lands in on the
  // owner.
  const size_t n = plan.slices.size();
  fill(slice_offset_, n, int64_t{0});
  fill(slice_slot_, n, -1);
  fill(slice_staging_, n, -1);
  fill(slice_guest_row_, n, int64_t{-1});
  fill(slice_prefetched_, n, uint8_t{0});
  slot_uses_.clear();
  receivers_.clear();
  for (size_t i = 0; i < n; ++i) {
    const Slice& s = plan.slices[i];
    FEPLB_REQUIRE_INPUT(s.expert >= 0 && s.expert < E && s.gpu >= 0 && s.gpu < R && s.rows >= 0,
                        "step layout: slice {} (expert {}, GPU {}, {} rows) outside the topology",
                        i, s.expert, s.gpu, s.rows);
    const int home = topo.home(s.expert);
    if (s.source == RowSource::kSource || (s.source == RowSource::kDispatched && s.gpu == home)) {
      if (error_.empty()) {
        error_ =
            "the GPU layer runs plans whose rows are dispatched to the experts' homes or straight "
            "to their "
            "helpers (not kept at their source, nor 'dispatched' to the home)";
      }
      continue;
    }
    computed_[s.expert] += s.rows;
    if (s.source == RowSource::kHome) {
      slice_offset_[i] = taken_[s.expert];
      taken_[s.expert] += s.rows;
      home_rows_[s.expert] += s.rows;
    } else {
      has_dispatched_ = true;
      receivers_.push_back({s.expert, s.gpu, static_cast<int>(i), s.rows, 0});
    }
    if (s.gpu != home) {
      int slot = -1;
      for (size_t j = 0; j < plan.copies.size() && slot < 0; ++j) {
        const Copy& c = plan.copies[j];
        if (c.kind == CopyKind::kPrefetchWeights && c.expert == s.expert && c.dst_gpu == s.gpu)
          slot = prefetch_slot_[j];
      }
      slice_prefetched_[i] = slot >= 0;
      slice_slot_[i] = slot >= 0 ? slot : static_cast<int>(guest_experts_[s.gpu]++);
      slice_guest_row_[i] = guest_rows_[s.gpu];
      guest_rows_[s.gpu] += s.rows;
      slice_staging_[i] = static_cast<int>(exported_[home]++);
      slot_uses_.push_back({static_cast<int>(i), s.gpu, slice_slot_[i], s.expert});
    }
  }
}

// Where each expert's rows start on its home, and every rank's buffers against the capacities.
void StepLayout::place_homes(const Topology& topo, const LayoutCapacity& capacity) {
  const int R = topo.num_ranks();
  // Phase 1 lands each home's experts one after another (the rows dispatched to the home: its
  // own slice and the kHome slices' rows), each expert's rows in source-rank order.
  for (int d = 0; d < R; ++d) {
    int64_t base = 0;
    for (int e : topo.local_experts(d)) {
      expert_base_[e] = base;
      base += home_rows_[e];
    }
    recv_rows_[d] = base;
    if (base > capacity.recv_rows && error_.empty()) {
      error_ = fmt::format(
          "rank {} receives {} rows in phase 1, over its capacity {} (raise recv_capacity_rows)", d,
          base, capacity.recv_rows);
    }
  }
  for (int g = 0; g < R && error_.empty(); ++g) {
    if (guest_experts_[g] > capacity.guest_slots) {
      error_ = fmt::format(
          "plan gives GPU {} {} guest experts, over its {} guest weight slots (max_num_dyn)", g,
          guest_experts_[g], capacity.guest_slots);
    } else if (guest_rows_[g] > capacity.guest_rows) {
      error_ = fmt::format(
          "plan gives GPU {} {} guest rows, over its capacity {} (raise guest_capacity_rows)", g,
          guest_rows_[g], capacity.guest_rows);
    } else if (capacity.staging_slots >= 0 && exported_[g] > capacity.staging_slots) {
      error_ = fmt::format(
          "plan exports {} expert slices from GPU {}, over its {} gradient staging slots (raise "
          "the "
          "runtime's staging slots)",
          exported_[g], g, capacity.staging_slots);
    }
  }
}

void StepLayout::build_receivers(const Topology& topo) {
  const int E = topo.num_experts();
  // Every expert's phase-1 receivers, ascending GPU, and where each starts among the expert's rows.
  for (int e = 0; e < E; ++e) receivers_.push_back({e, topo.home(e), -1, home_rows_[e], 0});
  std::sort(receivers_.begin(), receivers_.end(), [](const Receiver& a, const Receiver& b) {
    return a.expert != b.expert ? a.expert < b.expert
           : a.gpu != b.gpu     ? a.gpu < b.gpu
                                : a.slice < b.slice;
  });
  fill(receiver_begin_, static_cast<size_t>(E) + 1, 0);
  for (const Receiver& rc : receivers_) ++receiver_begin_[static_cast<size_t>(rc.expert) + 1];
  for (int e = 0; e < E; ++e) receiver_begin_[e + 1] += receiver_begin_[e];
  for (int e = 0; e < E; ++e) {
    int64_t ordinal = 0;
    for (int k = receiver_begin_[e]; k < receiver_begin_[e + 1]; ++k) {
      receivers_[static_cast<size_t>(k)].ordinal = ordinal;
      ordinal += receivers_[static_cast<size_t>(k)].rows;
    }
  }
}

// This rank's work lists: its home work (static experts first), its guests owner by owner (the
// schedule's turns), its exports helper by helper (the schedule's issue order).
void StepLayout::build_work(const Topology& topo, const Plan& plan) {
  const int R = topo.num_ranks();
  const int rank = rank_;
  const size_t n = plan.slices.size();
  // This rank's work lists.
  home_.clear();
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < n; ++i) {
      const Slice& s = plan.slices[i];
      if (s.gpu != rank || topo.home(s.expert) != rank || plan.dynamic[s.expert] != pass) continue;
      home_.push_back({static_cast<int>(i), s.expert, local_index_[s.expert],
                       expert_base_[s.expert] + slice_offset_[i], s.rows});
    }
  }
  // Every rank once: the `listed` ones in their order and the others ascending, the listed ones
  // first or last.
  const auto order = [&](std::span<const int> listed, bool listed_first, std::vector<int>& out) {
    listed_.assign(static_cast<size_t>(R), 0);
    for (int g : listed) listed_[static_cast<size_t>(g)] = 1;
    out.clear();
    if (listed_first) out.assign(listed.begin(), listed.end());
    for (int g = 0; g < R; ++g) {
      if (!listed_[static_cast<size_t>(g)]) out.push_back(g);
    }
    if (!listed_first) out.insert(out.end(), listed.begin(), listed.end());
  };
  // Owners in the order the receiver runs their guests: those whose guests here wait for no
  // phase-2 copy first, then the schedule's turns (by when the owner's copies land).
  turn_owners_.clear();
  for (const OwnerTurn& t : plan.schedule.turns_of(rank)) turn_owners_.push_back(t.owner);
  order(turn_owners_, /*listed_first=*/false, owner_order_);
  guests_.clear();
  for (int peer : owner_order_) {
    for (size_t i = 0; i < n; ++i) {
      const Slice& s = plan.slices[i];
      if (slice_slot_[i] < 0 || s.gpu != rank || topo.home(s.expert) != peer) continue;
      const bool dispatched = s.source == RowSource::kDispatched;
      const int64_t home_row = dispatched ? -1 : expert_base_[s.expert] + slice_offset_[i];
      guests_.push_back({static_cast<int>(i), s.expert, peer, slice_slot_[i], slice_staging_[i],
                         slice_guest_row_[i], home_row, s.rows, dispatched,
                         slice_prefetched_[i] != 0});
      guests_from_[peer] = 1;
      if (!dispatched) rows_from_[peer] = 1;
    }
  }
  // Helpers in issue order: those the schedule lists (this rank's phase-2 copies, by when the
  // first one to each starts), then the others ascending.
  order(plan.schedule.helpers_of(rank), /*listed_first=*/true, helper_order_);
  exports_.clear();
  for (int peer : helper_order_) {
    for (size_t i = 0; i < n; ++i) {
      const Slice& s = plan.slices[i];
      if (slice_slot_[i] < 0 || topo.home(s.expert) != rank || s.gpu != peer) continue;
      const bool dispatched = s.source == RowSource::kDispatched;
      const int64_t home_row = dispatched ? -1 : expert_base_[s.expert] + slice_offset_[i];
      exports_.push_back({static_cast<int>(i), s.expert, local_index_[s.expert], s.gpu,
                          slice_slot_[i], slice_staging_[i], home_row, slice_guest_row_[i], s.rows,
                          dispatched, slice_prefetched_[i] != 0});
      exports_to_[peer] = 1;
      if (!dispatched) rows_to_[peer] = 1;
    }
  }
}

// This rank's phase-1 chunks. A source's rows of expert e are ordinals [pre, pre + at(src, e))
// among e's rows in source-rank order; receiver k of e takes ordinals [ordinal_k, + rows_k).
void StepLayout::build_chunks(const Topology& topo, const RoutingStep& routing) {
  const int R = topo.num_ranks();
  const int E = topo.num_experts();
  sends_.clear();
  recvs_.clear();
  // Sends: the rows of each expert in send order, split over its receivers.
  int64_t send_row = 0;
  for (int e : send_order_) {
    int64_t pre = 0;
    for (int before = 0; before < rank_; ++before) pre += routing.at(before, e);
    const int64_t mine = routing.at(rank_, e);
    for (int k = receiver_begin_[e]; k < receiver_begin_[e + 1]; ++k) {
      const Receiver& rc = receivers_[static_cast<size_t>(k)];
      const int64_t rows = overlap(pre, mine, rc.ordinal, rc.rows);
      if (rc.slice >= 0 && rows == 0) continue;
      sends_.push_back({rc.gpu, send_row, rows, false});
      send_row += rows;
    }
  }
  // Receives: per source, its chunks to this rank in its send order.
  run_.assign(receivers_.size(), 0);
  pre_.assign(static_cast<size_t>(E), 0);
  for (int src = 0; src < R; ++src) {
    for (int e : send_order_) {
      const int64_t theirs = routing.at(src, e);
      for (int k = receiver_begin_[e]; k < receiver_begin_[e + 1]; ++k) {
        const Receiver& rc = receivers_[static_cast<size_t>(k)];
        if (rc.gpu != rank_) continue;
        const int64_t rows = overlap(pre_[e], theirs, rc.ordinal, rc.rows);
        if (rc.slice >= 0 && rows == 0) continue;
        const bool guest = rc.slice >= 0;
        const int64_t base =
            guest ? slice_guest_row_[static_cast<size_t>(rc.slice)] : expert_base_[e];
        recvs_.push_back({src, base + run_[static_cast<size_t>(k)], rows, guest});
        run_[static_cast<size_t>(k)] += rows;
      }
      pre_[e] += theirs;
    }
  }
}

int64_t StepLayout::exported_rows() const {
  int64_t rows = 0;
  for (const Export& x : exports_) rows += x.rows;
  return rows;
}

}  // namespace feplb::cuda
