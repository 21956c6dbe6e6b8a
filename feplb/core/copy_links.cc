#include "feplb/core/copy_links.h"

#include <algorithm>

namespace feplb {

std::span<const CopyTime> CopyTimer::time(const Plan& plan, const Topology& topo,
                                          const Knobs& knobs, double start_ms) {
  const int R = topo.num_ranks();
  const auto& copies = plan.copies;
  std::vector<CopyTime>& out = times_;
  out.assign(copies.size(), CopyTime{});
  const bool one_domain = topo.num_domains() == 1;
  const auto copy_ms = [&](const Copy& c) {
    const double gbps = one_domain || topo.same_domain(c.src_gpu, c.dst_gpu) ? knobs.copy_gbps
                                                                             : knobs.internode_gbps;
    return link_ms(c.bytes, gbps, knobs.copy_setup_us);
  };
  const auto waited_for = [](CopyKind k) {
    return k != CopyKind::kOutputRows && k != CopyKind::kReplicaWeights;
  };
  // Prefetches: first in, first out on both links.
  const double prefetch_start = -knobs.prefetch_window_us * 1e-3;
  std::vector<double>& in_ms = in_ms_;
  std::vector<double>& out_ms = out_ms_;
  in_ms.assign(static_cast<size_t>(R), prefetch_start);
  out_ms.assign(static_cast<size_t>(R), prefetch_start);
  for (size_t i = 0; i < copies.size(); ++i) {
    const Copy& c = copies[i];
    if (c.kind != CopyKind::kPrefetchWeights) continue;
    const double at = std::max(in_ms[c.dst_gpu], out_ms[c.src_gpu]);
    out[i] = {at, at + copy_ms(c), true};
    in_ms[c.dst_gpu] = out_ms[c.src_gpu] = out[i].end_ms;
  }
  CopyLinks& links = links_;
  links.reset(R, start_ms);
  for (int g = 0; g < R; ++g) links.start_at(g, in_ms[g], out_ms[g]);
  for (size_t i = 0; i < copies.size(); ++i) {
    const Copy& c = copies[i];
    if (c.kind == CopyKind::kPrefetchWeights || !waited_for(c.kind)) continue;
    const double t = copy_ms(c);
    const bool with_rows = c.kind == CopyKind::kWeights && i + 1 < copies.size() &&
                           copies[i + 1].kind == CopyKind::kTokenRows &&
                           copies[i + 1].expert == c.expert && copies[i + 1].src_gpu == c.src_gpu &&
                           copies[i + 1].dst_gpu == c.dst_gpu;
    const double rows_t = with_rows ? copy_ms(copies[i + 1]) : 0.0;
    const double at = links.start(c.src_gpu, c.dst_gpu, t + rows_t);
    const double end = links.add_at(c.src_gpu, c.dst_gpu, at, t + rows_t);
    out[i] = {at, with_rows ? at + t : end, true};
    if (with_rows) out[++i] = {at + t, end, true};
  }
  return out;
}

}  // namespace feplb

namespace feplb {
namespace {

size_t rank(int g) { return static_cast<size_t>(g); }

}  // namespace

template <typename GpuOf>
void ScheduleWriter::bucket(int num_ranks, size_t num_ids, GpuOf gpu_of, std::vector<int>& begin,
                            std::vector<int>& by_gpu) {
  begin.assign(rank(num_ranks) + 2, 0);
  for (size_t i = 0; i < num_ids; ++i) ++begin[rank(gpu_of(i)) + 2];
  for (int g = 0; g < num_ranks; ++g) begin[rank(g) + 2] += begin[rank(g) + 1];
  by_gpu.resize(num_ids);
  for (size_t i = 0; i < num_ids; ++i)
    by_gpu[static_cast<size_t>(begin[rank(gpu_of(i)) + 1]++)] = static_cast<int>(i);
}

void ScheduleWriter::write(Plan& plan, const Topology& topo, const Knobs& knobs,
                           const GemmCostModel& cost) {
  const int R = topo.num_ranks();
  const int64_t E = topo.num_experts();
  Schedule& s = plan.schedule;
  s.copy_start_ms = planned_copy_start_ms(plan, knobs, topo);
  const std::span<const CopyTime> times = timer_.time(plan, topo, knobs, s.copy_start_ms);
  s.copies.assign(times.begin(), times.end());
  s.prefetch_ms.assign(rank(R), Schedule::kNever);
  // The phase-2 copies a GPU waits for (weights, token rows); the prefetches into each GPU.
  copy_ids_.clear();
  for (size_t i = 0; i < plan.copies.size(); ++i) {
    const Copy& c = plan.copies[i];
    if (!times[i].timed) continue;
    if (c.kind == CopyKind::kPrefetchWeights) {
      s.prefetch_ms[rank(c.dst_gpu)] = std::max(s.prefetch_ms[rank(c.dst_gpu)], times[i].end_ms);
      continue;
    }
    copy_ids_.push_back(static_cast<int>(i));
  }
  held_.clear();
  for (const ResidentReplica& r : plan.resident) held_.push_back(r.gpu * E + r.expert);
  std::sort(held_.begin(), held_.end());
  write_turns(plan, topo, cost, times);
  set_waits(s, R);
  write_helpers(plan, R, times);
}

void ScheduleWriter::write_turns(Plan& plan, const Topology& topo, const GemmCostModel& cost,
                                 std::span<const CopyTime> times) {
  pair_copies(plan, topo, times);
  add_slices(plan, topo, cost);
  order_turns(plan.schedule, topo.num_ranks());
}

void ScheduleWriter::pair_copies(const Plan& plan, const Topology& topo,
                                 std::span<const CopyTime> times) {
  const int R = topo.num_ranks();
  const std::vector<Copy>& copies = plan.copies;
  bucket(
      R, copy_ids_.size(), [&](size_t i) { return copies[rank(copy_ids_[i])].dst_gpu; },
      copy_begin_, copy_by_gpu_);
  pairs_.clear();
  into_.clear();
  into_head_.assign(static_cast<size_t>(topo.num_experts()), -1);
  pair_begin_.resize(rank(R) + 1);
  pair_gpu_.assign(rank(R), -1);
  pair_at_.resize(rank(R));
  for (int g = 0; g < R; ++g) {
    pair_begin_[rank(g)] = static_cast<int>(pairs_.size());
    for (int k = copy_begin_[rank(g)]; k < copy_begin_[rank(g) + 1]; ++k) {
      const size_t i = rank(copy_ids_[rank(copy_by_gpu_[rank(k)])]);
      const Copy& c = copies[i];
      int& head = into_head_[rank(c.expert)];
      if (head < 0 || into_[rank(head)].gpu != g) {  // g's copies are in a row: one entry each
        into_.push_back({g, head});
        head = static_cast<int>(into_.size()) - 1;
      }
      if (pair_gpu_[rank(c.src_gpu)] != g) {
        pair_gpu_[rank(c.src_gpu)] = g;
        pair_at_[rank(c.src_gpu)] = static_cast<int>(pairs_.size());
        pairs_.push_back({g, c.src_gpu, Schedule::kNever, 0.0, false});
      }
      PairTime& t = pairs_[rank(pair_at_[rank(c.src_gpu)])];
      t.ms = std::max(t.ms, times[i].end_ms);
    }
  }
  pair_begin_[rank(R)] = static_cast<int>(pairs_.size());
}

void ScheduleWriter::add_slices(Plan& plan, const Topology& topo, const GemmCostModel& cost) {
  const int R = topo.num_ranks();
  const int64_t E = topo.num_experts();
  Schedule& s = plan.schedule;
  s.own_ms.assign(rank(R), 0.0);
  s.ready_ms.assign(rank(R), 0.0);
  unowned_.clear();
  for (const Slice& sl : plan.slices) {
    const int g = sl.gpu;
    const double ms = cost.expert_ms(sl.rows);
    const int home = topo.home(sl.expert);
    if (home == g ||
        (!held_.empty() && std::binary_search(held_.begin(), held_.end(), g * E + sl.expert))) {
      s.own_ms[rank(g)] += ms;
      continue;
    }
    bool copied = false;
    for (int k = into_head_[rank(sl.expert)]; k >= 0 && !copied; k = into_[rank(k)].next)
      copied = into_[rank(k)].gpu == g;
    if (!copied) {
      s.ready_ms[rank(g)] += ms;
      continue;
    }
    int p = pair_begin_[rank(g)];
    while (p < pair_begin_[rank(g) + 1] && pairs_[rank(p)].other != home) ++p;
    PairTime* t = p < pair_begin_[rank(g) + 1] ? &pairs_[rank(p)] : nullptr;
    for (size_t u = 0; !t && u < unowned_.size(); ++u) {
      if (unowned_[u].gpu == g && unowned_[u].other == home) t = &unowned_[u];
    }
    if (!t) t = &unowned_.emplace_back(PairTime{g, home, Schedule::kNever, 0.0, false});
    t->gemm_ms += ms;
    t->guests = true;
  }
}

void ScheduleWriter::order_turns(Schedule& s, int num_ranks) {
  s.turn_begin.assign(rank(num_ranks) + 1, 0);
  s.turns.clear();
  for (int g = 0; g < num_ranks; ++g) {
    turn_scratch_.clear();
    for (int p = pair_begin_[rank(g)]; p < pair_begin_[rank(g) + 1]; ++p) {
      if (pairs_[rank(p)].guests) turn_scratch_.push_back(pairs_[rank(p)]);
    }
    for (const PairTime& t : unowned_) {
      if (t.gpu == g) turn_scratch_.push_back(t);
    }
    std::sort(turn_scratch_.begin(), turn_scratch_.end(), [](const PairTime& a, const PairTime& b) {
      return a.ms != b.ms ? a.ms < b.ms : a.other < b.other;
    });
    for (const PairTime& t : turn_scratch_) s.turns.push_back({t.other, t.ms, t.gemm_ms, 0.0});
    s.turn_begin[rank(g) + 1] = static_cast<int>(s.turns.size());
  }
}

void ScheduleWriter::set_waits(Schedule& s, int num_ranks) {
  for (int g = 0; g < num_ranks; ++g) {
    const int begin = s.turn_begin[rank(g)], end = s.turn_begin[rank(g) + 1];
    if (begin == end) continue;
    // The timeline's steps 1 and 2, then each turn's wait (Schedule::timeline without slack).
    double t = std::max(s.own_ms[rank(g)], s.prefetch_ms[rank(g)]) + s.ready_ms[rank(g)];
    for (int i = begin; i < end; ++i) {
      OwnerTurn& turn = s.turns[static_cast<size_t>(i)];
      turn.wait_ms = std::max(0.0, turn.lands_ms - t);
      t = std::max(t, turn.lands_ms) + turn.gemm_ms;
    }
  }
}

void ScheduleWriter::write_helpers(Plan& plan, int num_ranks, std::span<const CopyTime> times) {
  const std::vector<Copy>& copies = plan.copies;
  Schedule& s = plan.schedule;
  bucket(
      num_ranks, copy_ids_.size(), [&](size_t i) { return copies[rank(copy_ids_[i])].src_gpu; },
      copy_begin_, copy_by_gpu_);
  pair_gpu_.assign(rank(num_ranks), -1);
  pair_at_.resize(rank(num_ranks));
  s.helper_begin.assign(rank(num_ranks) + 1, 0);
  s.helpers.clear();
  for (int g = 0; g < num_ranks; ++g) {
    // g's helpers, each with when g's first copy to it starts.
    pairs_.clear();
    for (int k = copy_begin_[rank(g)]; k < copy_begin_[rank(g) + 1]; ++k) {
      const size_t i = rank(copy_ids_[rank(copy_by_gpu_[rank(k)])]);
      const int h = copies[i].dst_gpu;
      if (pair_gpu_[rank(h)] != g) {
        pair_gpu_[rank(h)] = g;
        pair_at_[rank(h)] = static_cast<int>(pairs_.size());
        pairs_.push_back({g, h, times[i].start_ms, 0.0, true});
      } else {
        PairTime& t = pairs_[rank(pair_at_[rank(h)])];
        t.ms = std::min(t.ms, times[i].start_ms);
      }
    }
    std::sort(pairs_.begin(), pairs_.end(), [](const PairTime& a, const PairTime& b) {
      return a.ms != b.ms ? a.ms < b.ms : a.other < b.other;
    });
    for (const PairTime& t : pairs_) s.helpers.push_back(t.other);
    s.helper_begin[rank(g) + 1] = static_cast<int>(s.helpers.size());
  }
}

}  // namespace feplb
