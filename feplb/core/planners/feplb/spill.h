// The spill: within one NVLink domain, GPUs above the cap hand rows of their candidates to the
// least loaded receivers whose copies land in time, donors taking turns; one plan's per-step state.
#pragma once

#include <cstdint>
#include <vector>

#include "feplb/core/plan.h"
#include "feplb/core/planners/feplb/candidates.h"
#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/copy_model.h"
#include "feplb/core/planners/feplb/loads.h"
#include "feplb/core/planners/feplb/prefetch.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/planners/receiver_tree.h"

namespace feplb::feplb_detail {

// Per NVLink domain the target is exact (ceil(T / GPUs)); a GPU above target + tolerance hands rows
// of its busiest candidates to the GPU with the most room, whole experts when they fit, otherwise
// a slice (at least min_slice_rows, split points rounded to slice_align_rows, at most
// max_helpers_per_expert helpers per expert). Donors take turns, one expert each, the most loaded
// first, so that several hot GPUs share the receivers' links (rather than the hottest filling them
// all and the next finding every window closed).
//
// Receivers: an expert goes first to the GPUs holding its prefetched weights, then to the least
// loaded GPUs (ties: lower index) whose copy lands in time (the copy rule says what in time is;
// receiver_tree.h: a tournament tree over the domain's GPUs finds one in O(log n) typical steps),
// each taking what its room and its window allow; a slice that would land too late is cut to what
// lands in time. A donor whose egress is busy must leave a receiver that keeps room below the
// target the window for a minimum slice, so that a late copy does not strand the receiver's room.
// An expert gets max_helpers_per_expert helpers, more when it alone holds more than its donor's
// excess can give to them: up to 2 x min(rows, excess) / target, e.g. a hot expert of 5 GPUs'
// share over 10 helpers. A helper that takes less than an even share of the donor's excess (its
// room or window was less) does not count against the limit. When a donor cannot reach the target
// even with all its candidates (one very hot expert), it and the expert's helpers are levelled
// instead (water-filling). O(migrations x log R) per domain, no allocation once warm.
class Spill {
 public:
  // The units it reads and changes; all must outlive it.
  Spill(const PlannerContext& ctx, Loads& loads, CopyModel& copies, const CandidateSets& candidates,
        const PrefetchedWeights& prefetched)
      : ctx_(ctx),
        loads_(loads),
        copies_(copies),
        candidates_(candidates),
        prefetched_(prefetched) {}

  // A new plan in `mode` (kept by reference until the plan is made).
  void start(const FeplbConfig& mode);
  // Balances domain `dom` to `target` (a GPU above target + tol gives), taking copies that `rule`
  // (copy_rules.h) accepts; adds the migrations to `out`.
  template <typename Rule>
  void balance_domain(Rule& rule, int dom, int64_t target, int64_t tol, Plan& out);

 private:
  // Spills donor d's expert e to helpers; `rest`: the load of d's candidates after e.
  template <typename Rule>
  void spill_expert(Rule& rule, int e, int d, int64_t target, int64_t cap, int64_t tol,
                    int64_t rest, Plan& out);
  // The GPUs holding e's prefetched weights with room, least loaded first, into receivers_ (set
  // aside: not offered again from the tree); returns how many.
  size_t offer_prefetched(int e, int d);
  // `rows` of e from d to h: the copies queued, the rule's state, the loads, the plan.
  template <typename Rule>
  void give(Rule& rule, int e, int d, int h, int64_t rows, bool weights_there, Plan& out);
  // `rows` of e from d to h, or, when their copy would land too late, the most that land in time:
  // a multiple of slice_align_rows, at least min_slice_rows, leaving no sliver at home (0: none).
  template <typename Rule>
  int64_t rows_in_time(const Rule& rule, int e, int d, int h, int64_t rows,
                       bool weights_there) const;
  // The next receiver for e from d: the least loaded GPU in the tree whose copy of the slice it
  // would get (its room, at most what d has to shed) lands in time, or failing that one whose copy
  // of a minimum slice does. Appends it to receivers_ and sets it aside; false if none.
  template <typename Rule>
  bool next_receiver(const Rule& rule, int e, int d, int64_t target, int64_t tol, bool gather);
  // The receiver next_receiver() takes for `need`: the least loaded whose copy lands in time, else
  // (no reserve then) one whose copy of a minimum slice does; -1 if none. `reusable`: no GPU is
  // set aside, so the answer depends on `need` and the tree only, and the last such answer is
  // reused while neither changed (a donor often asks the same for its next candidate expert, e.g.
  // when no receiver has room for a slice).
  int find_receiver(ReceiverTree::Need need, bool reusable);
  static bool same_need(const ReceiverTree::Need& a, const ReceiverTree::Need& b);
  // Helpers expert e may have: max_helpers_per_expert, or 2 x min(rows, d's excess) / target when
  // that is more (a hot expert), at most the domain's other GPUs.
  int helpers_allowed(int e, int d, int64_t target) const;
  // Rows that the first `num` receivers take in total when filled up to `level`.
  int64_t fill(int64_t level, int num) const;
  // The load the first `num` receivers are filled up to with rows of expert e from donor d.
  // Normally the domain target (greedy: fewest helpers). When d cannot reach the target even
  // with e's helpers filled to it plus the load `rest` of its later candidates, and e alone can
  // bring d down to a common level, d and e's helpers are levelled instead (water-filling): e.g.
  // one hot expert split evenly over 1 + num GPUs.
  int64_t helper_level(int e, int d, int num, int64_t target, int64_t rest) const;
  // Rows of expert e that donor d gives helper h, which the level says should get `want`
  // (0: no worthwhile slice).
  int64_t slice_for(int e, int d, int h, int64_t want, int64_t target, int64_t cap,
                    int64_t tol) const;

  // Whether g may receive: room, a free guest slot and a window the rule still finds open.
  template <typename Rule>
  bool eligible(const Rule& rule, int g) const {
    return loads_.has_room(g) && loads_.guests[g] < mode_->max_num_dyn &&
           rule.window_open(g, copies_);
  }
  template <typename Rule>
  ReceiverTree::Leaf leaf(const Rule& rule, int g) const {
    return {loads_.load[g], rule.window_ms(g), copies_.links.in_ms(g), rule.guest_ms(g)};
  }
  template <typename Rule>
  void refresh(const Rule& rule, int g) {
    tree_.set(leaf_of_[g], g, eligible(rule, g), leaf(rule, g));
  }
  // Sets g aside while the current expert is spilled (one slice per GPU and expert): `in_tree`
  // takes it out of the tree (it is put back, with its state then, when the expert is done);
  // otherwise searches pass over it.
  void exclude(int g, bool in_tree);

  const PlannerContext& ctx_;
  Loads& loads_;
  CopyModel& copies_;
  const CandidateSets& candidates_;
  const PrefetchedWeights& prefetched_;
  const FeplbConfig* mode_ = nullptr;  // this plan's
  std::vector<int> donors_, receivers_;
  std::vector<int> next_candidate_;  // [num_ranks] a donor's next candidate (CandidateSets index)
  std::vector<int64_t> rest_;        // [num_ranks] load of a donor's candidates not offered yet
  // Gathering helpers for a hot expert: when d's egress is free after the copies to those found so
  // far, and the rows not yet assigned to them.
  double gather_out_ms_ = 0;
  int64_t gather_rows_ = 0;
  ReceiverTree tree_;  // the domain's receivers
  struct LastFind {
    uint64_t version = 0;  // the tree's version when it was searched (0: none)
    ReceiverTree::Need need;
    int gpu = -1;
  };
  LastFind last_find_;             // find_receiver()'s last reusable answer
  std::vector<int> leaf_of_;       // [num_ranks] tree leaf
  std::vector<uint8_t> excluded_;  // [num_ranks] set aside for the expert being spilled:
                                   // 1: passed over, 2: out of the tree
  std::vector<int> excluded_list_;
};

}  // namespace feplb::feplb_detail
