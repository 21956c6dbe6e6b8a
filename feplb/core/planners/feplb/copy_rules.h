// Copy rules: which copies a receiver may take, by when they land (copy_timing), one class per
// rule, each with the state it needs. The spill calls them through the same members (a template
// parameter: no branch on the rule in its loops):
//   kTimed, kTreeTiming             whether copies are timed; ReceiverTree::Need::timing
//   start(topo, measure, own)       per plan: each GPU's own GEMM time (own_ms_at_home()), the
//                                   rule's state emptied
//   targets_set(topo, loads, ...)   per plan, once the domains' targets are known
//   own_ms(g), guest_ms(g)          modelled GEMM time of g's work that needs no copy / waits
//   window_ms(g)                    by when a hidden copy into g must land at the latest
//   window_open(g, copies)          whether g's window still fits the shortest copy
//   finish_by_ms(d)                 the receivers' tree's bound for a late copy from donor d
//   fits(held, d, h, rows, lands)   whether `rows` (of an expert d holds `held` of) may go to h
//   record(held, d, h, rows, copied, lands)   after the migration: the times and the rule's state
// Times in ms from when the GEMMs start. A receiver runs its own work first, then each donor's
// guests once all that donor's copies to it have landed, donors in the order their last copies
// land (the GPU layer waits per donor; schedule.h). A copy that lands while the receiver still
// has its own work is hidden under every timed rule.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/copy_model.h"
#include "feplb/core/planners/feplb/loads.h"
#include "feplb/core/topology.h"

namespace feplb::feplb_detail {

// Each GPU's modelled GEMM time with every expert at home, into `out` [num_ranks] (what the timed
// rules start from; the same for every plan of one step), from `expert_ms` [num_experts], each
// expert's GEMM time at its count (Loads::expert_ms).
void own_ms_at_home(const Topology& topo, const std::vector<double>& expert_ms,
                    std::vector<double>& out);

// Copy time ignored (copy_timing = 0): any receiver, any slice; no times kept.
class IgnoreCopyTime {
 public:
  static constexpr bool kTimed = false;
  static constexpr int kTreeTiming = 0;
  void start(const Topology&, const LoadMeasure&, std::span<const double>) {}
  void targets_set(const Topology&, const Loads&, std::span<const int64_t>, int64_t) {}
  double own_ms(int) const { return 0.0; }
  double guest_ms(int) const { return 0.0; }
  double window_ms(int) const { return 0.0; }
  bool window_open(int, const CopyModel&) const { return true; }
  double finish_by_ms(int) const { return 0.0; }
  bool fits(int64_t, int, int, int64_t, double) const { return true; }
  void record(int64_t, int, int, int64_t, bool, double) {}
};

// What every timed rule keeps: each GPU's modelled GEMM time of the work it can run without
// waiting for a copy (own_ms: its own rows that stay on it, updated as it gives rows away, and
// guests that need no copy: one-hop rows of prefetched experts), and of the work that waits for
// copies (guest_ms).
class TimedRule {
 public:
  static constexpr bool kTimed = true;
  void start(const Topology& topo, const LoadMeasure& measure, std::span<const double> own);
  void targets_set(const Topology&, const Loads&, std::span<const int64_t>, int64_t) {}
  double own_ms(int g) const { return own_ms_[g]; }
  double guest_ms(int g) const { return guest_ms_[g]; }
  double window_ms(int g) const { return own_ms_[g]; }
  bool window_open(int, const CopyModel&) const { return true; }
  double finish_by_ms(int d) const { return own_ms_[d]; }

 protected:
  // d gave `rows` of an expert it held `held` of to h, by a copy (`copied`) or not.
  void record_times(int64_t held, int d, int h, int64_t rows, bool copied) {
    own_ms_[d] += gemm_ms(held - rows) - gemm_ms(held);
    (copied ? guest_ms_ : own_ms_)[h] += gemm_ms(rows);
  }
  double gemm_ms(int64_t rows) const { return measure_->gemm_ms(rows); }

  std::vector<double> own_ms_, guest_ms_;  // [num_ranks]
  const LoadMeasure* measure_ = nullptr;
};

// Hidden copies (copy_timing = 1, the default): a copy must land while its receiver still has
// work whose copies have landed: its own, then each donor's guests in landing order (so it may
// land after the receiver's own work if the guests of donors whose copies landed earlier still
// cover it). Keeps, per receiver, each donor's last landing and guest GEMM time, and checks the
// whole order exactly for each new copy (guests_in_time).
class HiddenCopies : public TimedRule {
 public:
  static constexpr int kTreeTiming = 1;
  void start(const Topology& topo, const LoadMeasure& measure, std::span<const double> own);
  // Its own work plus all its guests' (an upper bound: fits() checks the order).
  double window_ms(int g) const { return own_ms_[g] + guest_ms_[g]; }
  // A receiver whose window no longer fits the shortest copy (a weight copy) takes none.
  bool window_open(int g, const CopyModel& copies) const {
    return window_ms(g) - copies.links.in_ms(g) >= copies.copy_ms(0, true);
  }
  bool fits(int64_t, int d, int h, int64_t rows, double lands_ms) const {
    if (lands_ms <= own_ms_[h]) return true;
    return lands_ms <= window_ms(h) && guests_in_time(h, d, lands_ms, gemm_ms(rows));
  }
  void record(int64_t held, int d, int h, int64_t rows, bool copied, double lands_ms) {
    record_times(held, d, h, rows, copied);
    if (copied) arrive(arrivals_[h], d, lands_ms, gemm_ms(rows));
  }

  // Per receiver, a donor whose guests wait for copies: when its last copy lands and the GEMM
  // time of its guests there.
  struct Arrival {
    int donor;
    double lands_ms, gemm_ms;
  };

 private:
  // Into a receiver's donors: a copy from d that lands at `lands_ms`, with `gemm_ms` more of d's
  // guests.
  static void arrive(std::vector<Arrival>& a, int d, double lands_ms, double gemm_ms);
  // Whether h, given a copy from d that lands at `lands_ms` and `gemm` ms more of d's guests,
  // still never waits: each donor's guests (their last copy's landing, their GEMM time), in
  // landing order, land by the time h has run its own work and the guests before them.
  // O(donors to h x log) with no allocation once warm.
  bool guests_in_time(int h, int d, double lands_ms, double gemm) const;

  std::vector<std::vector<Arrival>> arrivals_;    // [num_ranks]
  mutable std::vector<Arrival> arrival_scratch_;  // guests_in_time()
};

// Exposed copies before the donor (copy_timing = 2): also a late copy (the receiver idles until
// it lands) after which the receiver, waiting and then computing its guests, still finishes
// before the donor does after giving the rows, and so do the donor's earlier late receivers: an
// exposed copy that rarely makes the layer slower.
class ExposedBeforeDonor : public TimedRule {
 public:
  static constexpr int kTreeTiming = 2;
  void start(const Topology& topo, const LoadMeasure& measure, std::span<const double> own);
  bool fits(int64_t held, int d, int h, int64_t rows, double lands_ms) const {
    if (lands_ms <= own_ms_[h]) return true;
    // d after giving the rows must still finish last among its late receivers, this one included.
    const double donor_after_ms = own_ms_[d] - gemm_ms(held) + gemm_ms(held - rows);
    return std::max(late_finish_ms_[d], lands_ms + guest_ms_[h] + gemm_ms(rows)) <= donor_after_ms;
  }
  void record(int64_t held, int d, int h, int64_t rows, bool copied, double lands_ms) {
    record_times(held, d, h, rows, copied);
    if (copied && lands_ms > own_ms_[h])
      late_finish_ms_[d] = std::max(late_finish_ms_[d], lands_ms + guest_ms_[h]);
  }

 private:
  std::vector<double> late_finish_ms_;  // [num_ranks] when each donor's late receivers finish
};

// Late copies by the busiest (copy_timing = 3): also a late copy after which the receiver, its own
// work, the wait and its guests included, finishes by the GEMM time of the busiest GPU that gives
// nothing away (a lower bound of the slowest GPU's, since a receiver's work only grows): a late
// copy that does not delay the layer.
class LateByBusiest : public TimedRule {
 public:
  static constexpr int kTreeTiming = 3;
  // finish_by_ms_: the largest own time of the GPUs within their domain's target + `tol`.
  void targets_set(const Topology& topo, const Loads& loads, std::span<const int64_t> targets,
                   int64_t tol);
  double finish_by_ms(int) const { return finish_by_ms_; }
  bool fits(int64_t, int, int h, int64_t rows, double lands_ms) const {
    if (lands_ms <= own_ms_[h]) return true;
    return std::max(own_ms_[h], lands_ms) + guest_ms_[h] + gemm_ms(rows) <= finish_by_ms_;
  }
  void record(int64_t held, int d, int h, int64_t rows, bool copied, double) {
    record_times(held, d, h, rows, copied);
  }

 private:
  double finish_by_ms_ = 0;  // late receivers finish by this
};

// One of each rule; with(rule, f) calls f with the one the mode names.
struct CopyRules {
  IgnoreCopyTime ignore;
  HiddenCopies hidden;
  ExposedBeforeDonor exposed;
  LateByBusiest late;

  template <typename F>
  void with(FeplbCopyRule rule, F&& f) {
    switch (rule) {
      case FeplbCopyRule::kIgnore:
        f(ignore);
        return;
      case FeplbCopyRule::kHidden:
        f(hidden);
        return;
      case FeplbCopyRule::kExposedBeforeDonor:
        f(exposed);
        return;
      case FeplbCopyRule::kLateByBusiest:
        f(late);
        return;
    }
  }
};

}  // namespace feplb::feplb_detail
